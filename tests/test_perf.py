"""`make perf` as a user runs it, for one deployment: both trees set it up
and are timed, and the counts that do not depend on the machine's load say
what the series changes (bench/perf.py, bench/perf_worker.py)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import perf


def test_make_perf_as_a_user_runs_it():
    """MLA + GQA-8 at TP 8, the check at rate 0.01: every job of both trees
    is timed; the series copies fewer bytes per store on every rank (one
    host copy of the MLA layers, not eight); with the check on, the
    scheduler's comparison of a job of 256 chunks looks at its sampled
    chunks; and the tables print it."""
    from test_demo import make

    arch = "MLA + GQA-8 mix"
    out = json.loads(make("perf", f"ARGS=--model '{arch}' --check 0.01 --json"))
    (release,), (series,) = out["0.34.0"]["rows"], out["0.34.0+series"]["rows"]
    assert release["arch"] == series["arch"] == arch
    assert "error" not in release and "error" not in series
    for rank in ("rank0", "rank1"):
        for job in perf.JOBS:
            ours, theirs = series["plain"][rank][job], release["plain"][rank][job]
            assert ours["us"] > 0 and theirs["us"] > 0
        store = "store_256"
        assert 0 < series["plain"][rank][store]["bytes"] < (
            release["plain"][rank][store]["bytes"]
        )
    manager = series["check_0.01"]["manager"]
    assert manager["check_replicas"] > 0 and manager["job_keys"] == 256
    assert manager["job_sampled"] < 256 * 0.05
    assert "check_0.01" not in release  # the release has no check
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        perf.print_tables(out["0.34.0"], out["0.34.0+series"], [0.01])
    assert f"check_replicas of a job of 256 chunks ({manager['job_sampled']}" in (
        printed.getvalue()
    )
