"""The main job: what TP-replication detection buys KV offloading.

For each architecture of bench/architectures.py at TP 1, 2, 4, 8, 16 and DCP
1, 2, runs bench/kv_tp_worker.py in three vLLM trees: the unpatched 0.30.0
(build/vllm-base), 0.30.0 with the seed patches alone (build/vllm-seed:
max_tp_shards, kv_tp_replicas and the single-copy offloading layout), and
with the whole series (build/vllm). It prints side by side what each tree's
own code decides: kv_tp_replicas, the host bytes the offloading connector
reserves per offloaded token, and how many tokens fit in 1 GiB of
`cpu_bytes_to_use`, next to the physical limit: every distinct piece of KV
stored once.

    python bench/demo.py [--json]     (make demo sets everything up first)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ws  # noqa: E402

WORKER = ROOT / "bench" / "kv_tp_worker.py"
# The last patch of the seed (the first part of the series).
SEED_LAST_PATCH = "0005-Doc-Document-KV-cache-replication-across-TP-ranks.patch"
TREES = ("base", "seed", "series")


def run_workers() -> dict[str, dict]:
    """Every tree at once: {"base": result, "seed": result, "series": result}."""
    workspace = ws.Workspace(ROOT)
    series = workspace.series()
    if SEED_LAST_PATCH not in series:
        raise SystemExit(f"patches/series has no {SEED_LAST_PATCH}: update the demo")
    seed = series[: series.index(SEED_LAST_PATCH) + 1]
    trees = {
        "base": workspace.base_tree(),
        "seed": workspace.snapshot_tree("vllm-seed", seed),
        "series": workspace.tree,
    }
    procs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in trees.items():
            env = dict(os.environ)
            if tree != workspace.tree:
                env["PYTHONPATH"] = str(tree)
            out = Path(tmp) / f"{name}.json"
            log = open(Path(tmp) / f"{name}.log", "w")
            procs[name] = (
                subprocess.Popen(
                    [sys.executable, str(WORKER), str(out)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                out,
                log,
            )
        results = {}
        for name, (proc, out, log) in procs.items():
            rc = proc.wait()
            log.close()
            if rc != 0:
                for other, _, _ in procs.values():
                    other.kill()
                sys.stderr.write(Path(log.name).read_text()[-4000:])
                raise SystemExit(
                    f"bench/demo.py: the {name} tree's worker failed (exit "
                    f"{rc}); its output ends above. Outside `make demo`, "
                    "source tools/testenv.sh first."
                )
            results[name] = json.loads(out.read_text())
            # Each result must come from the tree it claims to measure.
            assert Path(results[name]["vllm"]) == trees[name], results[name]["vllm"]
    return results


def merge(results: dict[str, dict]) -> list[dict]:
    rows = []
    for per_tree in zip(*(results[t]["rows"] for t in TREES), strict=True):
        keys = {(r["arch"], r["tp"], r["dcp"]) for r in per_tree}
        assert len(keys) == 1, keys  # every tree measures the same cases
        arch, tp, dcp = keys.pop()
        # The limit is the model's: every tree must find the same one.
        limits = {r.get("limit_bytes_per_token") for r in per_tree}
        assert len(limits) == 1, (arch, tp, dcp, limits)
        row = {
            "arch": arch,
            "tp": tp,
            "dcp": dcp,
            "limit_bytes_per_token": limits.pop(),
        }
        for tree, r in zip(TREES, per_tree):
            row[tree] = {
                k: v
                for k, v in r.items()
                if k not in ("arch", "tp", "dcp", "limit_bytes_per_token")
            }
        rows.append(row)
    return rows


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'TP':>3} {'DCP':>3} | {'host copies':>16} | "
        f"{'host KiB per offloaded token':>38} | {'tokens per GiB':>26} | "
        f"{'series/':>7}"
    )
    sub = (
        f"{'':>3} {'':>3} | {'base seed series':>16} | "
        f"{'base':>8} {'seed':>8} {'series':>8} {'limit':>11} | "
        f"{'base':>8} {'seed':>8} {'series':>8} | {'limit':>7}"
    )
    arch = None
    for row in rows:
        if row["arch"] != arch:
            arch = row["arch"]
            print(f"\n{arch}\n{header}\n{sub}\n{'-' * len(header)}")
        lead = f"{row['tp']:>3} {row['dcp']:>3} | "
        unsupported = [
            row[t].get("unsupported") for t in TREES if "unsupported" in row[t]
        ]
        if unsupported:
            print(f"{lead}not supported by vLLM: {unsupported[0]}")
            continue
        base, seed, series = (row[t] for t in TREES)
        limit = row["limit_bytes_per_token"]
        print(
            f"{lead}{base['host_copies']:>4} {seed['host_copies']:>4} "
            f"{series['host_copies']:>6} | "
            f"{_kib(base['host_bytes_per_token']):>8} "
            f"{_kib(seed['host_bytes_per_token']):>8} "
            f"{_kib(series['host_bytes_per_token']):>8} {_kib(limit):>11} | "
            f"{base['tokens_per_gib']:>8,} {seed['tokens_per_gib']:>8,} "
            f"{series['tokens_per_gib']:>8,} | "
            f"{series['host_bytes_per_token'] / limit:>6.2f}x"
        )
    print(
        "\nbase: vLLM 0.30.0 as released; seed: with the seed patches (up to "
        f"{SEED_LAST_PATCH});\nseries: with all of patches/series. Each column "
        "comes from that tree's own get_kv_cache_configs,\nbuild_offloading_config "
        "and CPUOffloadingSpec (1 GiB of cpu_bytes_to_use). host copies: of each\n"
        "offloaded chunk, one per group of TP ranks that hold identical KV. "
        "limit: every distinct\n"
        "piece of KV stored once (MLA-style caches once, GQA once per KV head, "
        "Mamba state once per rank,\nDCP token shards each once), from one rank's "
        "bytes weighted by each layer's share of its pages;\nseries/limit: host "
        "bytes of the series over that limit (alignment padding shows as a little "
        "over 1)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args()
    rows = merge(run_workers())
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
