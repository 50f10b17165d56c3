"""`make bench`: what users buy, prefix-cache hit rate and time to first
token, with vLLM 0.34.0 as released and with this project's series.

For each deployment of the demo (bench/architectures.py, at its usual TP
size, on hosts of 8 GPUs: TP 16 on two) and each workload of bench/workloads.py, replays the trace through
the real scheduler of each tree (bench/replay.py: vLLM's Scheduler, the
OffloadingConnector's scheduler side, the tree's own CPUOffloadingSpec and
manager), at each host memory size, and with an unbounded host cache (the
ceiling). It prints what fraction of the prompt tokens hit the GPU prefix
cache and host memory, the prefill tokens computed, and the estimated TTFT
(bench/costs.py: H200, PCIe 5 x16), release against series.

    python bench/bench.py [--json] [--plot PATH] [--model M] [--workload W]
                          [--policies lru,arc] [--requests N]
    (make bench sets everything up first)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ws

sys.path.insert(0, str(ROOT / "bench"))
import architectures
import costs
import workloads

GiB = 1 << 30
BASE = "0.34.0"
RELEASE, SERIES = "0.34.0", "0.34.0+series"
REPLAY = ROOT / "bench" / "replay.py"
# Host memory of the deployment (cpu_bytes_to_use), the sizes compared.
HOST_SIZES = (256 * GiB, 1024 * GiB, 2048 * GiB)
# The size the summary's TTFT is read at.
TTFT_SIZE = 1024 * GiB
# An unbounded host cache: more than any trace stores.
UNBOUNDED = 1 << 60
# Prompt tokens a replay runs (warm-up included), chosen so that `make
# bench` takes at most 10 minutes on a 2-core machine.
TARGET_TOKENS = 6_000_000
SEED = 0


def _size(n: int) -> str:
    if n >= UNBOUNDED:
        return "unbounded"
    return f"{n // GiB} GiB" if n < 1024 * GiB else f"{n // (1024 * GiB)} TiB"


def jobs(models, workload_names, policies, tokens) -> dict[str, list[dict]]:
    """The replays of each tree: every host size and policy in both; the
    ceiling (an unbounded LRU cache, which holds all a trace stores in
    either tree) in one of them, taking turns, for balance."""
    per_tree: dict[str, list[dict]] = {RELEASE: [], SERIES: []}
    turn = 0
    for arch in architectures.ARCHITECTURES:
        if models and not any(m in arch.name for m in models):
            continue
        for name in workload_names:
            caches = [
                {"host_bytes": size, "policy": policy}
                for policy in policies
                for size in HOST_SIZES
            ]
            for tree in (RELEASE, SERIES):
                extra = []
                if (turn % 2 == 0) == (tree == RELEASE):
                    extra = [{"host_bytes": UNBOUNDED, "policy": "lru"}]
                per_tree[tree].append(
                    {
                        "arch": arch.name,
                        "tp": arch.usual_tp,
                        "hosts": arch.usual_hosts,
                        "workload": name,
                        "seed": SEED,
                        "target_tokens": tokens,
                        "caches": caches + extra,
                    }
                )
            turn += 1
    return per_tree


def run_trees(per_tree: dict[str, list[dict]]) -> dict[str, dict]:
    """Both trees at once (a process each), in the base's test environment;
    progress on stderr as their jobs end."""
    workspace = ws.Workspace(ROOT, BASE)
    trees = {RELEASE: workspace.base_tree(), SERIES: workspace.tree}
    total = sum(len(jobs) for jobs in per_tree.values())
    procs = {}
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress"
        progress.touch()
        for label, tree in trees.items():
            jobs_file = Path(tmp) / f"{label}.jobs.json"
            jobs_file.write_text(json.dumps(per_tree[label]))
            out = Path(tmp) / f"{label}.json"
            log = Path(tmp) / f"{label}.log"
            env = {**workspace.test_environ(), "PYTHONPATH": str(tree)}
            with log.open("w") as f:
                proc = subprocess.Popen(
                    [
                        workspace.python,
                        str(REPLAY),
                        str(jobs_file),
                        str(out),
                        "--progress",
                        str(progress),
                    ],
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                )
            procs[label] = (proc, out, log)
        done = 0
        while any(proc.poll() is None for proc, _, _ in procs.values()):
            if any(proc.poll() for proc, _, _ in procs.values()):
                break  # one failed: no need to wait for the other
            time.sleep(2)
            now = len(progress.read_text().splitlines())
            if now != done:
                done = now
                sys.stderr.write(f"bench: {done} of {total} jobs done (both trees)\n")
        failed = [
            (label, proc.returncode, log)
            for label, (proc, _, log) in procs.items()
            if proc.poll() not in (None, 0)
        ]
        if failed:
            for proc, _, _ in procs.values():
                proc.kill()
            label, rc, log = failed[0]
            sys.stderr.write(log.read_text()[-4000:])
            raise SystemExit(
                f"bench/bench.py: the {label} tree's replay failed (exit {rc}); "
                "its output ends above. Outside `make bench`, source "
                "tools/testenv.sh first."
            )
        results = {}
        for label, (_, out, _) in procs.items():
            results[label] = json.loads(out.read_text())
            assert Path(results[label]["vllm"]) == trees[label], results[label]["vllm"]
    return results


def merge(results: dict[str, dict]) -> list[dict]:
    """One row per deployment and workload: its slice, and each tree's
    result per (host size, policy); the ceiling from whichever tree ran
    it."""
    rows = []
    for release, series in zip(
        results[RELEASE]["jobs"], results[SERIES]["jobs"], strict=True
    ):
        key = (release["arch"], release["tp"], release["workload"])
        assert key == (series["arch"], series["tp"], series["workload"]), key
        hosts = release.get("hosts", 1)
        assert hosts == series.get("hosts", 1), key
        # The same traffic in both (the series plans the GPU cache as the
        # release does).
        for field in ("slice", "sessions", "gpu_tokens_full", "gpu_bytes"):
            assert release[field] == series[field], (key, field)
        row = {
            "arch": key[0],
            "tp": key[1],
            "workload": key[2],
            "hosts": hosts,
            **{
                k: release[k]
                for k in (
                    "slice",
                    "sessions",
                    "sessions_per_s_full",
                    "span_s",
                    "warmup_s",
                    "gpu_tokens_full",
                )
            },
            RELEASE: {},
            SERIES: {},
        }
        for label, job in ((RELEASE, release), (SERIES, series)):
            for result in job["results"]:
                if result["host_bytes"] >= UNBOUNDED:
                    row["unbounded"] = result
                else:
                    row[label][f"{result['policy']}@{result['host_bytes']}"] = result
        rows.append(row)
    return rows


def _hits(result: dict) -> float:
    return result["gpu_hit_rate"] + result["host_hit_rate"]


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _ms(s: float) -> str:
    return f"{1000 * s:,.0f}"


def _shape(row: dict) -> str:
    return architectures.shape(row["tp"], row.get("hosts", 1))


def print_summary(rows: list[dict], policy: str) -> None:
    print(
        "Prompt tokens served from cache (GPU prefix cache + host memory) and "
        f"time to first token,\nvLLM {RELEASE} as released -> with the series, "
        f"at each model's usual TP size, on hosts of 8 GPUs ({policy.upper()}):\n"
    )
    width = max(len(r["arch"]) for r in rows)
    sizes = " ".join(f"{_size(s):>13}" for s in HOST_SIZES)
    head = (
        f"{'model':<{width}} {'hosts':>6} {'workload':<8} | {sizes} {'unbounded':>9} | "
        f"{'TTFT p50 ms':>15} {'TTFT p90 ms':>15}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        cells = []
        for size in HOST_SIZES:
            r, s = row[RELEASE][f"{policy}@{size}"], row[SERIES][f"{policy}@{size}"]
            cells.append(f"{_pct(_hits(r)):>5} -> {_pct(_hits(s)):>4}")
        r = row[RELEASE][f"{policy}@{TTFT_SIZE}"]
        s = row[SERIES][f"{policy}@{TTFT_SIZE}"]
        print(
            f"{row['arch']:<{width}} {_shape(row):>6} {row['workload']:<8} | "
            + " ".join(f"{c:>13}" for c in cells)
            + f" {_pct(_hits(row['unbounded'])):>9} | "
            f"{_ms(r['ttft_p50_s']):>6} -> {_ms(s['ttft_p50_s']):>5} "
            f"{_ms(r['ttft_p90_s']):>6} -> {_ms(s['ttft_p90_s']):>5}"
        )
    print(
        f"\nhosts: hosts x GPUs per host, TP over all of them. Host sizes: the "
        f"deployment's\ncpu_bytes_to_use, all hosts together; unbounded: a host "
        f"cache that never evicts\n(the ceiling). TTFT at {_size(TTFT_SIZE)}: "
        f"each request's host hits loaded over PCIe 5 x16, then\nits computed "
        f"tokens at the {costs.ACCELERATOR}s' peak (bench/costs.py; no "
        "queueing: a lower bound).\nWorkloads (bench/workloads.py):"
    )
    for shape in workloads.WORKLOADS.values():
        print(f"  {shape.name}: {shape.description}; {shape.sources}")


def print_detail(rows: list[dict], policies) -> None:
    print(
        "\nDetail: per deployment, workload, host size and policy, of the "
        "measured prompt tokens:\nGPU prefix-cache hits, host hits, computed; "
        "TTFT p50/p90 in ms; release, then series."
    )
    for row in rows:
        print(
            f"\n{row['arch']}, TP {row['tp']} ({_shape(row)}), {row['workload']}: "
            f"{row['sessions']} sessions, 1/{row['slice']:.1f} of the "
            f"deployment's ({row['sessions_per_s_full']:.2f} sessions/s over "
            f"{row['span_s']:.0f} s, the first {row['warmup_s']:.0f} s not "
            f"measured); GPU cache {row['gpu_tokens_full']:,} tokens"
        )
        results = [("unbounded", "", row["unbounded"])]
        for policy in policies:
            for size in HOST_SIZES:
                for label in (RELEASE, SERIES):
                    results.append(
                        (
                            f"{_size(size)} {policy}",
                            label,
                            row[label][f"{policy}@{size}"],
                        )
                    )
        for name, label, r in results:
            print(
                f"  {name:<14} {label:<14} GPU {_pct(r['gpu_hit_rate']):>4}  "
                f"host {_pct(r['host_hit_rate']):>4}  computed "
                f"{r['computed_tokens']:>11,}  TTFT {_ms(r['ttft_p50_s']):>6} / "
                f"{_ms(r['ttft_p90_s']):>6}  ({r['requests']} requests, "
                f"{r['host_chunks']:,} host chunks)"
            )


def plot(rows: list[dict], path: Path, policy: str) -> None:
    """Hit rate against host memory, per deployment: release and series,
    each workload, and the unbounded ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    archs = list(dict.fromkeys(r["arch"] for r in rows))
    cols = 3
    nrows = (len(archs) + cols - 1) // cols
    fig, axes = plt.subplots(
        nrows, cols, figsize=(12, 2.6 * nrows), squeeze=False, sharex=True
    )
    xs = [s / GiB for s in HOST_SIZES]
    numbers = {}
    for ax, arch in zip(axes.flat, archs):
        mine = [r for r in rows if r["arch"] == arch]
        for row in mine:
            color = "C0" if row["workload"] == "chat" else "C1"
            for label, style in ((RELEASE, ":"), (SERIES, "-")):
                ys = [_hits(row[label][f"{policy}@{s}"]) for s in HOST_SIZES]
                ax.plot(
                    xs,
                    ys,
                    style,
                    marker="o",
                    color=color,
                    label=f"{row['workload']}, {'series' if label == SERIES else label}",
                )
                numbers[f"{arch}|{row['workload']}|{label}"] = ys
            ax.axhline(_hits(row["unbounded"]), color=color, alpha=0.3, lw=3)
        ax.set_title(f"{arch}, TP {mine[0]['tp']} ({_shape(mine[0])})", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [_size(s) for s in HOST_SIZES], fontsize=7)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(archs) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(
        f"Prompt tokens served from cache against host memory ({policy.upper()}); "
        "bands: unbounded host cache",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(
        path,
        dpi=100,
        bbox_inches="tight",
        metadata={"Description": json.dumps(numbers, sort_keys=True)},
    )
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--plot", type=Path, help="draw the hit rates (PNG)")
    parser.add_argument("--model", action="append", help="models whose name has M")
    parser.add_argument(
        "--workload", action="append", choices=sorted(workloads.WORKLOADS)
    )
    parser.add_argument(
        "--policies", default="lru", help="eviction policies, comma separated"
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=TARGET_TOKENS,
        help="prompt tokens a replay runs (smaller: faster, noisier)",
    )
    args = parser.parse_args()
    policies = args.policies.split(",")
    for policy in policies:
        if policy not in ("lru", "arc"):
            parser.error(f"--policies: {policy!r} is neither lru nor arc")
    started = time.monotonic()
    per_tree = jobs(
        args.model, args.workload or list(workloads.WORKLOADS), policies, args.tokens
    )
    if not per_tree[RELEASE]:
        parser.error(f"--model {args.model}: no such model in bench/architectures.py")
    rows = merge(run_trees(per_tree))
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
    else:
        print_summary(rows, policies[0])
        print_detail(rows, policies)
        print(f"\n(replayed in {time.monotonic() - started:.0f} s)")
    if args.plot:
        plot(rows, args.plot, policies[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
