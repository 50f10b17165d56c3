"""tools/checks.sh runs every stage under a time limit of its own, and
stops one whose tests have gone idle: a stage whose processes never exit is
stopped, all of them, within its limit (or once no test started or ended for
the idle limit), and reported with the test it was in, and the summary
still prints."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A test that passes but leaves a non-daemon child waiting forever, as a
# multi-process test that fails before signalling its children does:
# pytest writes its summary, then waits for the child at exit, forever.
HANGING_TEST = """
import multiprocessing
import os
import time


def _wait_forever(path):
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)


def test_leaves_a_child_waiting():
    child = multiprocessing.get_context("fork").Process(
        target=_wait_forever, args=(os.environ["GUARD_CHILD_PID"],)
    )
    child.start()
    while os.path.getsize(os.environ["GUARD_CHILD_PID"]) == 0:
        time.sleep(0.05)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead, waiting for its parent to read its status.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _run_hanging_stage(tmp_path, name: str, limits: dict[str, str]):
    """HANGING_TEST as the stage `name` of tools/checks.sh, under `limits`
    (its CHECKS_* variables): (the run, its seconds, the test file)."""
    test_file = tmp_path / "test_hang.py"
    test_file.write_text(HANGING_TEST)
    pid_file = tmp_path / "child.pid"
    pid_file.write_text("")
    env = {
        **os.environ,
        **limits,
        "GUARD_CHILD_PID": str(pid_file),
        "PYTHONPATH": str(ROOT / "tools"),
    }
    start = time.monotonic()
    res = subprocess.run(
        ["bash", "tools/checks.sh", "stage", name,
         sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "checks_last_test", str(test_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    took = time.monotonic() - start
    out = res.stdout
    assert res.returncode != 0, out
    # The test passed, and then the stage hung: what the limits are for.
    assert "1 passed" in out, out
    assert out.rstrip().splitlines()[-2] == "=== summary", out
    # Every process of the stage is gone, the waiting child too.
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), f"the stage's child {pid} outlived it"
    return res, took, test_file


def test_a_stage_that_never_exits_is_stopped_at_its_limit(tmp_path):
    limit = 15
    res, took, test_file = _run_hanging_stage(
        tmp_path, "hanging stage", {"CHECKS_LIMIT": str(limit)}
    )
    # pytest names the test from its rootdir, which depends on the paths.
    assert re.search(
        rf"^FAIL  hanging stage \(stopped at its limit of {limit} s; last test "
        rf"started: \S*{test_file.name}::test_leaves_a_child_waiting\)$",
        res.stdout,
        re.M,
    ), res.stdout
    # Within the limit, the grace before SIGKILL and the script's start.
    assert took < limit + 20 + 30, took


def test_a_stage_whose_tests_went_idle_is_stopped_early(tmp_path):
    """The same hang under a generous wall-clock limit: the watchdog stops
    it once no test started or ended for the idle limit."""
    idle = 10
    res, took, test_file = _run_hanging_stage(
        tmp_path,
        "idle stage",
        {"CHECKS_LIMIT": "600", "CHECKS_IDLE_LIMIT": str(idle)},
    )
    assert re.search(
        rf"^FAIL  idle stage \(idle for {idle} s, stopped; last test: "
        rf"\S*{test_file.name}::test_leaves_a_child_waiting\)$",
        res.stdout,
        re.M,
    ), res.stdout
    # Far from the 600 s limit: the idle limit, the watchdog's poll, the
    # test's own start.
    assert took < idle + 2 + 20 + 60, took


def test_a_stage_that_ends_is_recorded_as_before():
    res = subprocess.run(
        ["bash", "tools/checks.sh", "stage", "quick stage", "true"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.rstrip().splitlines()[-1].startswith("PASS  quick stage ("), (
        res.stdout
    )


def test_region_files_a_stage_leaves_are_removed(tmp_path):
    """A KV offload region file that a stage's tests leave in /dev/shm (no
    process maps or holds it) is removed after the stage and named; one that
    a live process holds open stays, as do those that were there before."""
    tag = f"guard-test-{os.getpid()}"
    before = Path(f"/dev/shm/vllm_offload_{tag}-before.mmap")
    left = Path(f"/dev/shm/vllm_offload_{tag}-left.mmap")
    held = Path(f"/dev/shm/vllm_offload_{tag}-held.mmap")
    pid_file = tmp_path / "holder.pid"
    before.write_text("")
    # The stage leaves one file behind, and starts a process of its own
    # session that outlives it holding another open.
    stage = (
        f'echo data > "{left}"; '
        f'setsid bash -c \'echo $$ > "{pid_file}"; exec 3>"{held}"; '
        f"exec sleep 60' >/dev/null 2>&1 & "
        f'while [ ! -e "{held}" ]; do sleep 0.1; done'
    )
    try:
        res = subprocess.run(
            ["bash", "tools/checks.sh", "stage", "leaky stage", "bash", "-c", stage],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        assert (
            f"--- leaky stage: removed 1 KV offload region file(s) its tests "
            f"left in /dev/shm: {left}"
        ) in res.stdout, res.stdout
        assert not left.exists()
        assert held.exists() and before.exists()
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        for path in (before, left, held):
            path.unlink(missing_ok=True)
