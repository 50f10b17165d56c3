"""pytest plugin of the upstream runs (check-each and the suites): one rerun
for the upstream tests listed in bases/<V>/rerun.txt, and for no other test.

Those tests wait on spawned processes with a fixed timeout (a child that has
not exited within 10 s fails them), which a busy machine can miss. A test
that fails twice still fails; the project's own tests never get this plugin.
Reruns run through pytest-rerunfailures (vLLM's own test requirement)."""

from pathlib import Path

import deselected
import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--rerun-list",
        help="a file of the tests rerun once: bases/<V>/rerun.txt",
    )


def pytest_collection_modifyitems(config, items):
    path = config.getoption("--rerun-list")
    listed = [node for node, _ in deselected.read(Path(path))] if path else []
    for item in items:
        if any(item.nodeid.startswith(node) for node in listed):
            item.add_marker(pytest.mark.flaky(reruns=1))
