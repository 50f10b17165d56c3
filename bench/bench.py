"""`make bench`: what users buy on a real production trace, with vLLM 0.34.0
as released and with this project's series.

Replays a request trace (by default Mooncake's conversation trace,
bench/traces/) whole, for each deployment of the demo (bench/architectures.py,
at its usual TP size, on hosts of 8 GPUs: TP 16 on two): each tree sizes the
deployment's GPU KV cache and its host cache (bench/sizing.py, run in the
tree), and bench/trace_replay.py serves the trace through a model of the two
caches at every host size at once. It prints the share of prompt tokens
served from cache against host memory, release against series: the ceiling
(a host cache that never evicts), the host memory each needs to reach 90% of
it, the hit rate at 1 TiB of host memory per 8-GPU host, and the prefill
compute the cache saves (GPU-hours at peak FLOP/s, per hour of trace).

    python bench/bench.py [--json] [--plot PATH] [--model M] [--trace FILE]
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
import trace_replay
from trace_replay import BLOCK_TOKENS, NEVER

GiB = 1 << 30
BASE = "0.34.0"
RELEASE, SERIES = "0.34.0", "0.34.0+series"
SIZING = ROOT / "bench" / "sizing.py"
TRACE = ROOT / "bench" / "traces" / "mooncake_conversation_trace.jsonl.gz"
# The host sizes of the sweep, in GPU prefix caches: host memory that holds
# that many times the GPU cache's tokens in the release's layout.
SWEEP = (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
# Host memory an 8-GPU host gives the KV cache: half of the 2 TB of system
# memory of an NVIDIA DGX H200 (its datasheet), the rest left to the OS,
# the weights' staging and the engine.
HOST_BYTES_PER_HOST = 1024 * GiB
# The share of the ceiling the headline asks for.
TARGET = 0.9


def deployments(models: list[str] | None) -> list[dict]:
    """Each deployment of the demo's summary at its usual TP size and hosts."""
    return [
        {"arch": arch.name, "tp": arch.usual_tp, "hosts": arch.usual_hosts}
        for arch in architectures.ARCHITECTURES
        if not models or any(m in arch.name for m in models)
    ]


def run_trees(per_tree: dict[str, list[dict]]) -> dict[str, dict]:
    """bench/sizing.py in both trees at once (a process each), in the base's
    test environment; progress on stderr as their jobs end."""
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
                        str(SIZING),
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
                sys.stderr.write(
                    f"bench: {done} of {total} deployments sized (both trees)\n"
                )
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
                f"bench/bench.py: the {label} tree's sizing failed (exit {rc}); "
                "its output ends above. Outside `make bench`, source "
                "tools/testenv.sh first."
            )
        results = {}
        for label, (_, out, _) in procs.items():
            results[label] = json.loads(out.read_text())
            assert Path(results[label]["vllm"]) == trees[label], results[label]["vllm"]
    return results


def _run_seconds(compute: costs.Compute, row: dict):
    """How long a request holds its GPU blocks once admitted: its prefill at
    peak on the tokens the GPU cache did not hold, then its answer decoded
    one token a step at batch 1 (bench/costs.py), over its mean context."""
    tp = row["tp"]
    per_token = row["rank_bytes_per_token"]

    def seconds(r: trace_replay.Request, gpu_hit_blocks: int) -> float:
        cached = min(r.input_length, gpu_hit_blocks * BLOCK_TOKENS)
        prefill = costs.prefill_seconds(compute, tp, cached, r.input_length - cached)
        context = (r.input_length + r.output_length / 2) * per_token
        step = costs.decode_seconds_per_token(compute, tp, context)
        return prefill + r.output_length * step

    return seconds


def _prefill_gpu_hours(
    compute: costs.Compute, replay: trace_replay.Replay, host_blocks: float
) -> float:
    """The GPU-hours at peak bf16 FLOP/s of the trace's prefills with a host
    cache of `host_blocks` blocks (no cache at all for -1)."""
    flops = 0.0
    for s in replay.served:
        hits = 0
        if host_blocks >= 0:
            hits = s.gpu_hit_blocks + s.host_hit_blocks(host_blocks)
        cached = min(s.prompt_tokens, hits * BLOCK_TOKENS)
        flops += costs.prefill_flops(compute, cached, s.prompt_tokens - cached)
    return flops / costs.H200_BF16_FLOP_PER_S / 3600


def measure(requests: list[trace_replay.Request], sized: dict[str, dict]) -> list[dict]:
    """One row per deployment (measure_one), from each tree's sizing."""
    return [
        measure_one(requests, release, series)
        for release, series in zip(
            sized[RELEASE]["jobs"], sized[SERIES]["jobs"], strict=True
        )
    ]


def measure_one(
    requests: list[trace_replay.Request], release: dict, series: dict
) -> dict:
    """The trace through the deployment's GPU cache (the same in both trees:
    the series does not change KV cache planning), and what each tree's host
    cache adds at each host size."""
    span_h = max(1.0, requests[-1].arrival_s - requests[0].arrival_s) / 3600
    for key in ("arch", "tp", "hosts", "gpu_tokens", "rank_bytes_per_token"):
        assert release[key] == series[key], (release, series, key)
    compute = costs.COMPUTE[release["arch"]]
    replay = trace_replay.replay(
        requests,
        release["gpu_tokens"] // BLOCK_TOKENS,
        _run_seconds(compute, release),
    )
    block_bytes = {
        label: job["host_bytes_per_chunk"] * BLOCK_TOKENS / job["tokens_per_chunk"]
        for label, job in ((RELEASE, release), (SERIES, series))
    }

    def blocks(label: str, host_bytes: float) -> int:
        return int(host_bytes // block_bytes[label])

    def rates(host_bytes: float) -> dict:
        return {
            "host_bytes": host_bytes,
            **{
                label: replay.hit_rate(blocks(label, host_bytes))
                for label in block_bytes
            },
        }

    ceiling = replay.hit_rate(NEVER)
    needed = replay.host_blocks_to_reach(TARGET * ceiling)
    host_bytes = HOST_BYTES_PER_HOST * release["hosts"]
    gpu_cache_bytes = release["gpu_tokens"] * block_bytes[RELEASE] / BLOCK_TOKENS
    return {
        **{
            k: release[k]
            for k in ("arch", "tp", "hosts", "gpu_tokens", "rank_bytes_per_token")
        },
        "host_bytes_per_token": {
            label: b / BLOCK_TOKENS for label, b in block_bytes.items()
        },
        "requests": len(replay.served),
        "too_long": replay.too_long,
        "max_running": replay.max_running,
        "max_wait_s": replay.max_wait_s,
        "prompt_tokens": replay.prompt_tokens,
        "gpu_hit_rate": replay.hit_rate(0),
        "ceiling": ceiling,
        "sweep": [rates(k * gpu_cache_bytes) for k in SWEEP],
        "typical": rates(host_bytes),
        "host_bytes_for_target": {
            label: needed * b for label, b in block_bytes.items()
        },
        "prefill_gpu_hours_per_hour": {
            "no cache": _prefill_gpu_hours(compute, replay, -1) / span_h,
            **{
                label: _prefill_gpu_hours(compute, replay, blocks(label, host_bytes))
                / span_h
                for label in block_bytes
            },
        },
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _size(n: float) -> str:
    if n >= 1024 * GiB:
        return f"{n / (1024 * GiB):.1f} TiB"
    return f"{n / GiB:.0f} GiB"


def _shape(row: dict) -> str:
    return architectures.shape(row["tp"], row["hosts"])


def _describe(requests: list[trace_replay.Request], path: Path) -> str:
    span = requests[-1].arrival_s - requests[0].arrival_s
    prompt = sum(r.input_length for r in requests)
    return (
        f"{path.name}: {len(requests):,} requests over {span / 60:.0f} min, "
        f"{prompt / 1e6:.1f} M prompt tokens"
    )


def print_summary(rows: list[dict], about: str) -> None:
    print(
        f"{about}, replayed whole. Prompt tokens served from cache (GPU prefix "
        f"cache + host memory),\nvLLM {RELEASE} as released -> with the series, "
        "each model at its usual TP size on hosts of 8 GPUs\n(LRU, vLLM's "
        "default eviction policy):\n"
    )
    width = max(len(r["arch"]) for r in rows)
    per_host = _size(HOST_BYTES_PER_HOST)
    head = (
        f"{'model':<{width}} {'hosts':>6} | {'GPU only':>8} "
        f"{per_host + ' a host':>17} {'ceiling':>7} | "
        f"{'host memory for 90% of ceiling':>31} | {'prefill GPU-h/h':>17}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        t = row["typical"]
        need = row["host_bytes_for_target"]
        hours = row["prefill_gpu_hours_per_hour"]
        print(
            f"{row['arch']:<{width}} {_shape(row):>6} | {_pct(row['gpu_hit_rate']):>8} "
            f"{_pct(t[RELEASE]) + ' -> ' + _pct(t[SERIES]):>17} "
            f"{_pct(row['ceiling']):>7} | "
            f"{_size(need[RELEASE]) + ' -> ' + _size(need[SERIES]):>31} | "
            f"{hours[RELEASE]:>7.1f} -> {hours[SERIES]:>6.1f}"
        )
    print(
        f"\nhosts: hosts x GPUs per host, TP over all of them. {per_host} a host: "
        "the hit rate with that much host\nmemory (cpu_bytes_to_use) on each "
        "host. ceiling: a host cache that never evicts. prefill GPU-h/h:\n"
        "the H200 GPU-hours of prefill compute per hour of trace, at peak bf16 "
        f"FLOP/s (modelled: FLOPs\nof the computed tokens, bench/costs.py), at "
        f"{per_host} a host; without any cache: see the detail.\n"
        "Modelled (bench/trace_replay.py): vLLM's GPU prefix cache and the "
        "connector's LRU host cache, at the\ntrace's 512-token blocks; requests "
        "overlap from their timestamps, each holding its blocks for its\n"
        "prefill and decode at peak rates. Sizes (GPU tokens, host bytes a "
        "token) from each tree itself."
    )


def print_detail(rows: list[dict]) -> None:
    print(
        "\nDetail: the hit rate at each host size (all hosts together), release "
        "-> series; sizes in GPU\nprefix caches (host memory that holds that "
        "many times the GPU cache's tokens in the release's layout)."
    )
    for row in rows:
        per_token = row["host_bytes_per_token"]
        hours = row["prefill_gpu_hours_per_hour"]
        print(
            f"\n{row['arch']}, TP {row['tp']} ({_shape(row)}): GPU cache "
            f"{row['gpu_tokens']:,} tokens; host bytes a token "
            f"{per_token[RELEASE]:,.0f} -> {per_token[SERIES]:,.0f}; "
            f"{row['requests']:,} requests ({row['too_long']} longer than the "
            f"GPU cache), up to {row['max_running']} at once, the longest wait "
            f"for room {row['max_wait_s']:.1f} s; prefill GPU-h/h without a "
            f"cache {hours['no cache']:.1f}"
        )
        for k, point in zip(SWEEP, row["sweep"], strict=True):
            print(
                f"  {k:>5g} x GPU cache  {_size(point['host_bytes']):>9}  "
                f"{_pct(point[RELEASE]):>6} -> {_pct(point[SERIES]):>6}"
            )
        print(f"  unbounded                    {_pct(row['ceiling']):>6}")


def plot(rows: list[dict], path: Path) -> None:
    """Hit rate against host memory, per deployment: release and series,
    and the ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    nrows = (len(rows) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(12, 2.6 * nrows), squeeze=False)
    numbers = {}
    for ax, row in zip(axes.flat, rows):
        xs = [p["host_bytes"] / GiB for p in row["sweep"]]
        for label, style in ((RELEASE, ":"), (SERIES, "-")):
            ys = [p[label] for p in row["sweep"]]
            name = "series" if label == SERIES else f"{label} release"
            ax.plot(xs, ys, style, marker="o", color="C0", label=name)
            numbers[f"{row['arch']}|{label}"] = ys
        ax.axhline(row["ceiling"], color="C1", alpha=0.4, lw=3, label="ceiling")
        ax.axvline(
            HOST_BYTES_PER_HOST * row["hosts"] / GiB, color="grey", lw=0.8, ls="--"
        )
        ax.set_title(f"{row['arch']} ({_shape(row)})", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 0.45)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("host memory, GiB", fontsize=7)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(
        "Prompt tokens served from cache against host memory, Mooncake "
        "conversation trace (dashed: 1 TiB a host)",
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
        "--trace",
        type=Path,
        default=TRACE,
        help="a trace in the Mooncake format (JSON lines, gzipped or not)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    try:
        requests = trace_replay.load(args.trace)
    except (OSError, trace_replay.TraceError) as e:
        parser.error(f"--trace: {e}")
    jobs = deployments(args.model)
    if not jobs:
        parser.error(f"--model {args.model}: no such model in bench/architectures.py")
    rows = measure(requests, run_trees({RELEASE: jobs, SERIES: jobs}))
    if args.json:
        print(json.dumps({"trace": str(args.trace), "rows": rows}, indent=1))
    else:
        print_summary(rows, _describe(requests, args.trace))
        print_detail(rows)
        print(f"\n(sized and replayed in {time.monotonic() - started:.0f} s)")
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
