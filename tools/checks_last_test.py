"""pytest plugin of tools/checks.sh: writes the id of each test, as it
starts, to the file that CHECKS_LAST_TEST names, and touches the file as
it ends, so that a stage stopped at its time limit can name the test it was
in, and one where no test started or ended for a while is known to hang
(nothing without the variable)."""

import os


def pytest_runtest_logstart(nodeid, location):
    path = os.environ.get("CHECKS_LAST_TEST")
    if path:
        with open(path, "w") as f:
            f.write(f"{nodeid}\n")


def pytest_runtest_logfinish(nodeid, location):
    path = os.environ.get("CHECKS_LAST_TEST")
    if path:
        os.utime(path)
