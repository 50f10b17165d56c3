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

sys.path.insert(0, str(ROOT / "bench"))
import architectures  # noqa: E402

GiB = 1 << 30

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


def run_workers(filters: list[str] | None = None) -> dict[str, dict]:
    """Every tree at once: {label: result}. `filters`: the worker's --model
    and --tp arguments (the rows to measure; default: all)."""
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
                    [python, str(WORKER), str(out), *(filters or [])],
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


def _ok(row: dict) -> bool:
    return not any("unsupported" in row[t] for t in LABELS)


def summary_rows(rows: list[dict]) -> list[dict]:
    """One row per model: at the TP size it is usually served at, DCP 1."""
    usual = {a.name: a.usual_tp for a in architectures.ARCHITECTURES}
    return [r for r in rows if r["dcp"] == 1 and r["tp"] == usual.get(r["arch"])]


def _tokens(n: float) -> str:
    return f"{n:,.0f}"


def print_summary(rows: list[dict]) -> None:
    """What each model gains at its usual TP size: offloaded tokens that fit
    in 1 GiB of cpu_bytes_to_use, vLLM 0.33.0 against 0.33.0 with the series
    and the physical limit."""
    print(
        "Offloaded tokens per GiB of host memory (cpu_bytes_to_use), at each "
        "model's usual TP size:\n"
    )
    width = max(len(a.name) for a in architectures.ARCHITECTURES)
    head = (
        f"{'model':<{width}} {'TP':>3} | {'0.33.0':>8} {'canonical':>9} "
        f"{'series':>8} {'limit':>8} | {'gain':>6} {'of limit':>8}"
    )
    print(head)
    print("-" * len(head))
    for row in summary_rows(rows):
        if not _ok(row):
            continue
        release, series = row["0.33.0"], row["0.33.0+series"]
        canonical = release["canonical"]["worker"]["tokens_per_gib"]
        limit = GiB / row["limit_bytes_per_token"]
        print(
            f"{row['arch']:<{width}} {row['tp']:>3} | "
            f"{_tokens(release['tokens_per_gib']):>8} {_tokens(canonical):>9} "
            f"{_tokens(series['tokens_per_gib']):>8} {_tokens(limit):>8} | "
            f"{series['tokens_per_gib'] / release['tokens_per_gib']:>5.1f}x "
            f"{series['tokens_per_gib'] / limit:>7.0%}"
        )
    print(
        "\n0.33.0: vLLM 0.33.0 as released (CPUOffloadingSpec); canonical: its "
        "canonical layout\n(TieringOffloadingSpec, canonical_layout), upstream's "
        "strongest configuration; series: 0.33.0\nwith this project's series; "
        "limit: every distinct piece of KV stored once; gain: series over\n"
        "0.33.0; of limit: how close the series gets. Every model at every TP "
        "and DCP size follows."
    )
    mixed = [
        row
        for row in summary_rows(rows)
        if _ok(row) and len(row["0.33.0+series"]["layer_classes"] or ()) > 1
    ]
    if not mixed:
        return
    print(
        "\nWhere a model's layer classes need different host copy counts, the "
        "copies each needs (the\nseries plans each layer's replica groups, and "
        "the engine names them at start-up). Classes\nin one KV cache group "
        "(a target and its draft, MLA beside GQA) keep their own copies in\n"
        "every chunk; the KV cache groups of a hybrid keep theirs in host units "
        "that all groups share:"
    )
    for row in mixed:
        series = row["0.33.0+series"]
        needs = ", ".join(
            f"{c['copies']} for "
            + " + ".join(f"{n} {what}" for what, n in c["layers"].items())
            + f" layer{'s' if sum(c['layers'].values()) > 1 else ''}"
            for c in series["layer_classes"]
        )
        kept = (
            "each class keeps its own"
            if series["layer_copies"] or series["group_copies"]
            else f"{series['host_copies']} kept"
        )
        print(f"  {row['arch']}, TP {row['tp']}: {needs}; {kept}")


def plot_summary(rows: list[dict], path: Path) -> None:
    """The summary as a bar chart (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [r for r in summary_rows(rows) if _ok(r)]
    names = [f"{r['arch']}, TP {r['tp']}" for r in lines]
    series = {
        "vLLM 0.33.0": [r["0.33.0"]["tokens_per_gib"] for r in lines],
        "0.33.0 canonical layout": [
            r["0.33.0"]["canonical"]["worker"]["tokens_per_gib"] for r in lines
        ],
        "0.33.0 + series": [r["0.33.0+series"]["tokens_per_gib"] for r in lines],
        "limit (distinct KV once)": [GiB / r["limit_bytes_per_token"] for r in lines],
    }
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(lines) + 1.5))
    height = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ys = [y + (i - (len(series) - 1) / 2) * height for y in range(len(lines))]
        ax.barh(ys, values, height, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("offloaded tokens that fit in 1 GiB of host memory")
    ax.set_yticks(range(len(lines)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_title("KV offloading, at each model's usual TP size", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=2)
    fig.tight_layout()
    # The numbers drawn, so that a chart can be checked against the demo's.
    numbers = {
        name: {k: v[i] for k, v in series.items()}
        for i, name in enumerate(r["arch"] for r in lines)
    }
    fig.savefig(
        path,
        dpi=110,
        metadata={"Description": json.dumps(numbers, sort_keys=True)},
    )
    plt.close(fig)


def print_table(rows: list[dict]) -> None:
    # Column labels under each release, and the widths of the copy columns.
    short = ("rel", "seed", "series", "rel", "series")
    widths = [max(4, len(s)) for s in short]
    copies_w = sum(widths) + len(widths) - 1  # 0.30.0 spans the first three
    kib_w = 9 * len(short) + 8
    header = (
        f"{'TP':>3} {'DCP':>3} | {'host copies':^{copies_w}} | "
        f"{'host KiB per offloaded token':^{kib_w}} | {'series/limit':^13} | "
        f"{'canonical':^9} | {'store KiB':^13}"
    )
    bases = (
        f"{'':>3} {'':>3} | {'0.30.0':<{sum(widths[:3]) + 3}}"
        f"{'0.33.0':<{sum(widths[3:]) + 1}} | {'0.30.0':<27}{'0.33.0':<{kib_w - 27}} "
        f"| {'0.30.0':>6} {'0.33.0':>6} | {'0.33.0':^9} | {'0.33.0 series':^13}"
    )
    sub = (
        f"{'':>3} {'':>3} | "
        + " ".join(f"{s:>{w}}" for s, w in zip(short, widths))
        + " | "
        + " ".join(f"{s:>8}" for s in short)
        + f" {'limit':>8} | {'':>13} | {'copies':^9} | {'rank':>6} {'total':>6}"
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
        canonical = row["0.33.0"]["canonical"]
        worker, scheduler = canonical["worker"], canonical["scheduler"]
        # Worker / scheduler host copies, marked where the two sides disagree.
        canon = f"{worker['host_copies']}/{scheduler['host_copies']}"
        if not canonical["agree"]:
            canon += " !"
        series = row["0.33.0+series"]
        store = (
            f"{_kib(series['busiest_rank_store_bytes_per_token']):>6} "
            f"{_kib(series['store_bytes_per_token']):>6}"
        )
        print(
            f"{lead}{copies} | {kib} {_kib(limit):>8} | {ratios} | {canon:^9} | {store}"
        )
    print(
        "\nrel: the vLLM release as published (0.33.0 has upstream's own version "
        "of the seed);\nseed: 0.30.0 with the seed patches (up to "
        f"{SEED_LAST_PATCH});\nseries: with all of patches/<release>/series. "
        "Each column comes from that tree's own\nget_kv_cache_configs, "
        "build_offloading_config and CPUOffloadingSpec (1 GiB of cpu_bytes_to_use;\n"
        "tokens per GiB are in --json). host copies: of each offloaded chunk, one "
        "per group of TP\nranks that hold identical KV (with a decimal point: "
        "averaged over the layers, weighted by\ntheir pages, where each layer "
        "keeps its own copies; over a hybrid's KV cache groups where each\n"
        "group keeps its own, a chunk of every group counted per chunk of "
        "tokens). limit: every distinct "
        "piece of KV stored once (MLA-style caches\nonce, GQA once per KV head, "
        "Mamba state once per rank, DCP token shards each once), from one\nrank's "
        "bytes weighted by each layer's share of its KV cache group's pages, "
        "averaged over the\ngroups (a chunk of tokens is a chunk of every "
        "group); series/limit: host "
        "bytes of each\nseries over that limit (alignment padding shows as a "
        "little over 1). canonical: host copies of 0.33.0's\ncanonical layout "
        "(TieringOffloadingSpec, canonical_layout) on a worker / on the "
        "scheduler, decided\nby the release's own build_offloading_config on "
        "each side's KV cache config; ! where they\ndisagree (the scheduler "
        "keeps one spec per group). store KiB: device-to-host bytes per\n"
        "offloaded token with the 0.33.0 series, written by the busiest rank and "
        "by all ranks together."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    parser.add_argument(
        "--model", action="append", help="only models whose name contains this"
    )
    parser.add_argument("--tp", action="append", type=int, help="only this TP size")
    parser.add_argument("--plot", type=Path, help="write the summary as a PNG chart")
    args = parser.parse_args()
    # The chart shows every model: measure every row for it.
    filters = [] if args.plot else [
        *(f"--model={m}" for m in args.model or []),
        *(f"--tp={tp}" for tp in args.tp or []),
    ]  # fmt: skip
    rows = merge(run_workers(filters))
    if args.plot:
        plot_summary(rows, args.plot)
    rows = [
        r for r in rows if architectures.wanted(r["arch"], r["tp"], args.model, args.tp)
    ]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        print_summary(rows)
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
