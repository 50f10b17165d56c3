"""Each upstream test listed in bases/V/deselected.txt fails the same way on
the unpatched base V as on its patched tree, so the list hides no failure
that the series causes.

Runs the listed tests for real in both trees (build/vllm-V and the pristine
build/vllm-V-base), with V's environment, and compares, test by test, the
outcome and the exception that pytest records. The exception's type is
compared, not its text: torch words one failure in two ways from run to run
(bases/0.34.0/deselected.txt says when). On a busy machine the same tests
fail on an assertion now and then (the transfer's error reported as a
failed submit rather than raised), so a node may fail with any type that
the entry's tests show on the base.
"""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import deselected
import pytest
import ws

ROOT = Path(__file__).resolve().parent.parent
ENTRIES = [(base, node) for base in ws.bases() for node, _ in deselected.entries(base)]


@pytest.mark.parametrize("base", ws.bases())
def test_every_entry_has_a_reason(base):
    for node, reason in deselected.entries(base):
        assert "::" in node or node.endswith(".py"), node
        assert len(reason.split()) >= 3, f"{node}: reason too short: {reason!r}"


def _env(workspace: ws.Workspace, pythonpath: str | None) -> dict[str, str]:
    env = workspace.test_environ()
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def _start(
    workspace: ws.Workspace,
    tree: Path,
    prefixes: list[str],
    report: Path,
    pythonpath: str | None,
):
    """Start running, in `tree`, the test files that hold the listed tests."""
    env = _env(workspace, pythonpath)
    python = workspace.python
    origin = subprocess.run(
        [python, "-c", "import vllm; print(vllm.__file__)"],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(origin) == tree / "vllm" / "__init__.py", origin
    paths = sorted({prefix.split("::")[0] for prefix in prefixes})
    return subprocess.Popen(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         f"--junitxml={report}", *paths],
        cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _held(path: str) -> bool:
    """Whether a live process maps `path` or holds it open."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if path in (proc / "maps").read_text():
                return True
            if any(os.readlink(fd) == path for fd in (proc / "fd").iterdir()):
                return True
        except OSError:
            continue
    return False


def _remove_left_regions(before: set[str]) -> None:
    """The deselected tests fail mid-transfer, before their KV offload
    region is cleaned up: remove the region files they left in /dev/shm
    (new since `before`, and no live process maps or holds them)."""
    for path in glob.glob("/dev/shm/vllm_offload_*"):
        if path not in before and not _held(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _exception_type(message: str | None) -> str | None:
    """The exception's type from pytest's failure message ("Type: text")."""
    return None if message is None else message.split(":", 1)[0].strip()


def _results(report: Path) -> dict[str, tuple[str, str | None]]:
    """{node id: (outcome, exception type)} from a junit report."""
    results = {}
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        results[f"{module}.py::{case.get('name')}"] = (
            "passed" if failure is None else failure.tag,
            None if failure is None else _exception_type(failure.get("message")),
        )
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{base: results}: the files of a base's listed tests, run in its patched
    tree and in the unpatched release at the same time, once per base."""
    cache: dict[str, tuple[dict, dict]] = {}

    def get(version: str) -> tuple[dict, dict]:
        if version not in cache:
            workspace = ws.Workspace(ROOT, version)
            assert (workspace.tree / ".git").exists(), "run `make install` first"
            base = workspace.base_tree()
            tmp = tmp_path_factory.mktemp(f"deselected-{version}")
            prefixes = [node for node, _ in deselected.entries(version)]
            regions = set(glob.glob("/dev/shm/vllm_offload_*"))
            procs = [
                _start(workspace, workspace.tree, prefixes, tmp / "patched.xml", None),
                _start(workspace, base, prefixes, tmp / "base.xml", str(base)),
            ]  # fmt: skip
            for proc in procs:
                proc.wait()
            _remove_left_regions(regions)
            cache[version] = _results(tmp / "patched.xml"), _results(tmp / "base.xml")
        return cache[version]

    return get


@pytest.mark.parametrize(("version", "prefix"), ENTRIES)
def test_deselected_test_fails_the_same_on_the_base(version, prefix, runs):
    patched, base = runs(version)
    nodes = sorted(n for n in patched if n.startswith(prefix))
    assert nodes, f"{prefix} matches no test"
    assert nodes == sorted(n for n in base if n.startswith(prefix))
    # How the entry's tests fail on the base. Which of them a node shows can
    # depend on timing (a transfer thread's error raised, or reported as a
    # failed submit), so each node's failure must be one the base shows.
    base_failures = {base[node] for node in nodes}
    for node in nodes:
        outcome, exception = patched[node]
        assert outcome == "failure", f"{node} does not fail on the patched tree"
        assert base[node][0] == "failure", f"{node} does not fail on the base"
        assert (outcome, exception) in base_failures, (
            f"{node} fails with {exception} with the series, which none of "
            f"these tests does on the base: {sorted(map(str, base_failures))}"
        )



@pytest.mark.parametrize("base", ws.bases())
def test_every_rerun_names_an_upstream_test_with_a_reason(base):
    for node, reason in deselected.entries(base, "rerun.txt"):
        path, _, name = node.partition("::")
        assert name and (ROOT / "build" / f"vllm-{base}" / path).exists(), node
        assert f"def {name}(" in (ROOT / "build" / f"vllm-{base}" / path).read_text()
        assert len(reason.split()) >= 3, f"{node}: reason too short: {reason!r}"


@pytest.mark.parametrize(
    "failures, outcome", [(1, "1 failed, 1 passed, 1 rerun"), (2, "2 failed, 1 rerun")]
)
def test_a_listed_test_is_rerun_once_and_no_other(tmp_path, failures, outcome):
    """tools/ws_rerun_plugin.py: a listed test that fails once passes on its
    rerun, one that fails twice fails; an unlisted test is never rerun."""
    (tmp_path / "test_x.py").write_text(
        "import pathlib\n"
        "def test_listed(tmp_path_factory):\n"
        "    count = pathlib.Path(__file__).with_name('runs')\n"
        "    runs = int(count.read_text()) + 1 if count.exists() else 1\n"
        "    count.write_text(str(runs))\n"
        f"    assert runs > {failures}\n"
        "def test_unlisted():\n"
        "    assert False\n"
    )
    (tmp_path / "rerun.txt").write_text("test_x.py::test_listed  # fails at first\n")
    result = subprocess.run(
        [ws.Workspace(base=ws.bases()[-1]).python, "-m", "pytest", "-q",
         "-p", "no:cacheprovider", "-p", "ws_rerun_plugin",
         f"--rerun-list={tmp_path / 'rerun.txt'}", "test_x.py"],
        cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tools")},
    )  # fmt: skip
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith(outcome), result.stdout
