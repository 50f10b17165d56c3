import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

# Name each test as it starts, for a stage of tools/checks.sh stopped at its
# time limit.
from checks_last_test import pytest_runtest_logstart  # noqa: E402, F401
