"""The main job: what TP-replication detection buys KV offloading.

For each architecture of bench/architectures.py at TP 1, 2, 4, 8, 16 and DCP
1, 2, 4, 8, runs bench/kv_tp_worker.py in five vLLM trees, each with its own
base's environment: vLLM 0.30.0 as released (build/vllm-0.30.0-base), 0.30.0
with the seed patches alone (build/vllm-0.30.0-seed: max_tp_shards,
kv_tp_replicas and the single-copy offloading layout), 0.30.0 with its whole
series (build/vllm-0.30.0), vLLM 0.33.0 as released (build/vllm-0.33.0-base:
upstream's own version of the seed) and 0.33.0 with its series
(build/vllm-0.33.0). It prints side by side what each tree's own code
decides: kv_tp_replicas, the host bytes the offloading connector reserves
per offloaded token, and how many tokens fit in 1 GiB of
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
# The last patch of the seed (the first part of the 0.30.0 series).
SEED_LAST_PATCH = "0005-Doc-Document-KV-cache-replication-across-TP-ranks.patch"
# The trees, in the order of the columns: (label, base, which tree).
TREES = (
    ("0.30.0", "0.30.0", "release"),
    ("0.30.0+seed", "0.30.0", "seed"),
    ("0.30.0+series", "0.30.0", "series"),
    ("0.33.0", "0.33.0", "release"),
    ("0.33.0+series", "0.33.0", "series"),
)
LABELS = tuple(label for label, _, _ in TREES)


def tree_of(workspace: ws.Workspace, which: str) -> Path:
    if which == "release":
        return workspace.base_tree()
    if which == "series":
        return workspace.tree
    series = workspace.series()
    if SEED_LAST_PATCH not in series:
        raise SystemExit(
            f"{workspace.rel(workspace.series_file)} has no {SEED_LAST_PATCH}: "
            "update the demo"
        )
    return workspace.snapshot_tree("seed", series[: series.index(SEED_LAST_PATCH) + 1])


def run_workers() -> dict[str, dict]:
    """Every tree at once: {label: result}."""
    workspaces = {base: ws.Workspace(ROOT, base) for _, base, _ in TREES}
    trees = {
        label: (workspaces[base].python, tree_of(workspaces[base], which))
        for label, base, which in TREES
    }
    procs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (python, tree) in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}
            out = Path(tmp) / f"{name}.json"
            log = open(Path(tmp) / f"{name}.log", "w")
            procs[name] = (
                subprocess.Popen(
                    [python, str(WORKER), str(out)],
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
            assert Path(results[name]["vllm"]) == trees[name][1], results[name]["vllm"]
    return results


def merge(results: dict[str, dict]) -> list[dict]:
    rows = []
    for per_tree in zip(*(results[t]["rows"] for t in LABELS), strict=True):
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
        for tree, r in zip(LABELS, per_tree):
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
    # Column labels under each release, and the widths of the copy columns.
    short = ("rel", "seed", "series", "rel", "series")
    widths = [max(4, len(s)) for s in short]
    copies_w = sum(widths) + len(widths) - 1  # 0.30.0 spans the first three
    kib_w = 9 * len(short) + 8
    header = (
        f"{'TP':>3} {'DCP':>3} | {'host copies':^{copies_w}} | "
        f"{'host KiB per offloaded token':^{kib_w}} | {'series/limit':^13}"
    )
    bases = (
        f"{'':>3} {'':>3} | {'0.30.0':<{sum(widths[:3]) + 3}}"
        f"{'0.33.0':<{sum(widths[3:]) + 1}} | {'0.30.0':<27}{'0.33.0':<{kib_w - 27}} "
        f"| {'0.30.0':>6} {'0.33.0':>6}"
    )
    sub = (
        f"{'':>3} {'':>3} | "
        + " ".join(f"{s:>{w}}" for s, w in zip(short, widths))
        + " | "
        + " ".join(f"{s:>8}" for s in short)
        + f" {'limit':>8} | {'':>13}"
    )
    arch = None
    for row in rows:
        if row["arch"] != arch:
            arch = row["arch"]
            print(f"\n{arch}\n{header}\n{bases}\n{sub}\n{'-' * len(header)}")
        lead = f"{row['tp']:>3} {row['dcp']:>3} | "
        unsupported = [
            f"{t}: {row[t]['unsupported']}" for t in LABELS if "unsupported" in row[t]
        ]
        if unsupported:
            print(f"{lead}not supported by vLLM {unsupported[0]}")
            continue
        trees = [row[t] for t in LABELS]
        limit = row["limit_bytes_per_token"]
        copies = " ".join(f"{t['host_copies']:>{w}}" for w, t in zip(widths, trees))
        kib = " ".join(f"{_kib(t['host_bytes_per_token']):>8}" for t in trees)
        ratios = " ".join(
            f"{row[t]['host_bytes_per_token'] / limit:>5.2f}x"
            for t in ("0.30.0+series", "0.33.0+series")
        )
        print(f"{lead}{copies} | {kib} {_kib(limit):>8} | {ratios}")
    print(
        "\nrel: the vLLM release as published (0.33.0 has upstream's own version "
        "of the seed);\nseed: 0.30.0 with the seed patches (up to "
        f"{SEED_LAST_PATCH});\nseries: with all of patches/<release>/series. "
        "Each column comes from that tree's own\nget_kv_cache_configs, "
        "build_offloading_config and CPUOffloadingSpec (1 GiB of cpu_bytes_to_use;\n"
        "tokens per GiB are in --json). host copies: of each offloaded chunk, one "
        "per group of TP\nranks that hold identical KV. limit: every distinct "
        "piece of KV stored once (MLA-style caches\nonce, GQA once per KV head, "
        "Mamba state once per rank, DCP token shards each once), from one\nrank's "
        "bytes weighted by each layer's share of its pages; series/limit: host "
        "bytes of each\nseries over that limit (alignment padding shows as a "
        "little over 1)."
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
