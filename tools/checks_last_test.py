"""pytest plugin of tools/checks.sh: writes the id of each test, as it
starts, to the file that CHECKS_LAST_TEST names, so that a stage stopped at
its time limit can name the test it was in (nothing without the variable)."""

import os


def pytest_runtest_logstart(nodeid, location):
    path = os.environ.get("CHECKS_LAST_TEST")
    if path:
        with open(path, "w") as f:
            f.write(f"{nodeid}\n")
