"""`make perf`: the per-step cost of the KV offloading series against vLLM
0.34.0 as released, side by side, in one run.

Runs bench/perf_worker.py in the release's tree (build/vllm-0.34.0-base)
and then in the series' (build/vllm-0.34.0), one after the other, and
prints, for each deployment of the demo's summary, the median microseconds
of the connector worker's store and load submission per job (descriptors
included), of its completion, and of the manager's work per request, with
the Python calls and copy descriptors of one run beside them (counts do not
depend on the machine's load; times do), then the series with the runtime
replica check on (`--check RATE`, default 0.01 and 1.0). A benchmark, not a
test: it asserts nothing. See bench/perf_worker.py for what is modelled.

    python bench/perf.py [--json] [--model NAME] [--check RATE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ws  # noqa: E402

WORKER = ROOT / "bench" / "perf_worker.py"
BASE = "0.34.0"
JOBS = ("store_16", "store_256", "load_16", "load_256")


def run(tree: Path, args: list[str]) -> dict:
    workspace = ws.Workspace(ROOT, BASE)
    env = {**workspace.test_environ(), "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "perf.json"
        log = Path(tmp) / "perf.log"
        with open(log, "w") as f:
            rc = subprocess.call(
                [workspace.python, str(WORKER), str(out), *args],
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        if rc != 0:
            sys.stderr.write(log.read_text()[-4000:])
            raise SystemExit(f"bench/perf.py: the worker failed in {tree} ({rc})")
        return json.loads(out.read_text())


def _cell(entry: dict | None) -> str:
    if entry is None:
        return "-"
    python, c = entry["calls"]
    return (
        f"{entry['us']:6.0f} {entry['max_us']:6.0f} {python + c:6.0f} "
        f"{entry['descriptors']:7.0f} {entry['bytes'] / 2**20:7.2f}"
    )


def _failure(release: dict, series: dict) -> str:
    """Which tree failed to set the deployment up, and its assertion."""
    return "; ".join(
        f"{name}: {row['error'][:100]}"
        for name, row in (("0.34.0", release), ("series", series))
        if "error" in row
    )


def _ratio(series: float, release: float) -> str:
    return f"{series / release:5.2f}x" if release else "  -  "


def print_tables(release: dict, series: dict, rates: list[float]) -> None:
    rows = {r["arch"]: r for r in release["rows"]}
    print(
        "Per-step cost of vLLM 0.34.0 as released and of its series, per job or "
        "request, each\nthe median over repeated runs on this machine (no "
        "device: bench/perf_worker.py).\n"
        "Worker columns: mean and slowest microseconds per job over a round of "
        "TP consecutive\njobs (ranks that share a copy take turns storing it, "
        "job by job), Python + C calls,\ncopy descriptors and MiB copied per "
        "job: counts do not depend on the machine's load."
    )
    head = f"{'us':>6} {'max':>6} {'calls':>6} {'desc':>7} {'MiB':>7}"
    for job in JOBS:
        kind, chunks = job.split("_")
        print(
            f"\nConnector worker, a {kind} job of {chunks} chunks of every "
            "group: submission (device pointers, descriptors, bookkeeping)"
        )
        print(f"{'deployment':40} rank {'0.34.0':^36} {'series':^36} us ratio")
        print(f"{'':40} {'':4} {head} {head}")
        for row in series["rows"]:
            base = rows[row["arch"]]
            name = f"{row['arch'][:32]} TP {row['tp']}"
            if "error" in row or "error" in base:
                print(f"{name:40} fails: {_failure(base, row)}")
                continue
            for rank in ("rank0", "rank1"):
                theirs = base["plain"][rank][job]
                ours = row["plain"][rank][job]
                print(
                    f"{name:40} {rank[-1]:>4} {_cell(theirs)} {_cell(ours)} "
                    f"{_ratio(ours['us'], theirs['us'])}"
                )
                name = ""
    print(
        "\nScheduler's manager, one request of 64 chunks of every group in "
        "steady state\n(lookup, prepare_store with evictions, complete_store, "
        "prepare_load, complete_load)"
    )
    print(
        f"{'deployment':40} {'0.34.0 us (calls)':>19} {'series us (calls)':>19} ratio"
    )
    for row in series["rows"]:
        if "error" in row or "error" in rows[row["arch"]]:
            continue
        base = rows[row["arch"]]["plain"]["manager"]
        ours = row["plain"]["manager"]
        print(
            f"{row['arch'][:32] + ' TP ' + str(row['tp']):40} "
            f"{base['request_us']:9.0f} ({sum(base['request_calls']):6d}) "
            f"{ours['request_us']:9.0f} ({sum(ours['request_calls']):6d}) "
            f"{_ratio(ours['request_us'], base['request_us'])}"
        )
    for rate in rates:
        key = f"check_{rate}"
        checked = [r for r in series["rows"] if key in r]
        if not checked:
            continue
        print(
            f"\nThe series with verify_tp_replicas = {rate}, against the series "
            "without it: store jobs on rank 0 (mean us), the manager per request"
        )
        for row in checked:
            parts = []
            for job in ("store_16",):
                on, off = row[key]["rank0"][job], row["plain"]["rank0"][job]
                parts.append(
                    f"{job} {on['us']:.0f} us ({_ratio(on['us'], off['us']).strip()}, "
                    f"{sum(on['calls']):.0f} calls)"
                )
            on, off = row[key]["manager"], row["plain"]["manager"]
            parts.append(
                f"manager {on['request_us']:.0f} us "
                f"({_ratio(on['request_us'], off['request_us']).strip()}, "
                f"check_replicas {on['check_replicas']:.0f} us)"
            )
            parts.append(
                f"check_replicas of a job of {on['job_keys']} chunks "
                f"({on['job_sampled']} sampled) {on['job_check_us']:.0f} us"
            )
            print(f"  {row['arch'][:32]} TP {row['tp']}: " + "; ".join(parts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the raw results")
    parser.add_argument("--model", action="append", help="models to measure")
    parser.add_argument("--check", type=float, action="append", help="check rates")
    parser.add_argument(
        "--tree", type=Path, help="the series' tree (default: the one make builds)"
    )
    args = parser.parse_args()
    rates = args.check or [0.01, 1.0]
    workspace = ws.Workspace(ROOT, BASE)
    filters = [f"--model={m}" for m in args.model or []]
    release = run(workspace.base_tree(), filters)
    series = run(
        args.tree or workspace.tree, [*filters, *(f"--check={r}" for r in rates)]
    )
    if args.json:
        print(json.dumps({"0.34.0": release, "0.34.0+series": series}, indent=1))
    else:
        print_tables(release, series, rates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
