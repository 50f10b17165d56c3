"""The main job: what TP-replication detection buys KV offloading.

For each architecture of bench/architectures.py at TP 1, 2, 4, 8, 16 and DCP
1, 2, 4, 8, runs bench/kv_tp_worker.py in five vLLM trees, each with its own
base's environment: vLLM 0.30.0 as released (build/vllm-0.30.0-base), 0.30.0
with the seed patches alone (build/vllm-0.30.0-seed: max_tp_shards,
kv_tp_replicas and the single-copy offloading layout), 0.30.0 with its whole
series (build/vllm-0.30.0), vLLM 0.34.0 as released (build/vllm-0.34.0-base:
upstream's own version of the seed) and 0.34.0 with its series
(build/vllm-0.34.0: one host layout of each layer's copies per replica
group). It prints side by side what each tree's own code decides:
kv_tp_replicas, the host bytes the offloading connector reserves per
offloaded token, and how many tokens fit in 1 GiB of `cpu_bytes_to_use`,
next to the physical limit: every distinct piece of KV stored once; and, for
comparison, the 0.33.0 series as its last demo measured it
(bench/results/0.33.0-series.json).

One accounting for every tree: a chunk of tokens is a chunk of EVERY
offloaded KV cache group, and its host bytes are what the spec reserves for
all of them (a row per group's chunk in the releases, the seed and the 0.30.0
series; the host units of each group's chunk with the 0.34.0 series).

    python bench/demo.py [--json]     (make demo sets everything up first)
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
    ("0.34.0", "0.34.0", "release"),
    ("0.34.0+series", "0.34.0", "series"),
)
LABELS = tuple(label for label, _, _ in TREES)
# The current base: its release and its series lead the summary.
RELEASE, SERIES = "0.34.0", "0.34.0+series"
# The previous base's series, as its last demo measured it (the base is
# dropped; git history keeps it).
RECORDED = "0.33.0+series"
RECORDED_FILE = ROOT / "bench" / "results" / "0.33.0-series.json"
# What a row is of: a model at a TP and DCP size, on hosts, with PP.
KEY = ("arch", "tp", "dcp", "hosts", "pp")


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
        label: (workspaces[base], tree_of(workspaces[base], which))
        for label, base, which in TREES
    }
    procs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (workspace, tree) in trees.items():
            # The base's own environment (its base.lock's test_env).
            env = {**workspace.test_environ(), "PYTHONPATH": str(tree)}
            python = workspace.python
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


def recorded_033() -> dict[tuple[str, int, int], dict]:
    """The 0.33.0 series' rows as its last demo measured them, by (arch, TP,
    DCP)."""
    rows = json.loads(RECORDED_FILE.read_text())["rows"]
    return {(r["arch"], r["tp"], r["dcp"]): r for r in rows}


def _recorded_row(
    recorded: dict | None, trees: dict[str, dict], hosts: int, pp: int
) -> dict:
    """The 0.33.0 series' row in this demo's accounting. Its demo counted a
    chunk of tokens as one chunk of an average KV cache group; a chunk of
    every group is as many of those as the model offloads groups: the same
    number in 0.30.0 and 0.34.0, and in 0.33.0, whose rows record a rank's
    block of one group as one of them has it. Its demo measured one host
    without PP only: nothing for several, or for PP."""
    if hosts > 1 or pp > 1:
        return {"host_bytes_per_token": None}
    if recorded is None:
        raise SystemExit(f"{RECORDED_FILE.relative_to(ROOT)} has no row for this case")
    if "unsupported" in recorded:
        return {"unsupported": recorded["unsupported"]}
    # (Every tree supports what the 0.33.0 series did.)
    groups = {trees[t].get("offloaded_groups") for t in LABELS}
    assert len(groups) == 1 and None not in groups, groups
    (groups,) = groups
    blocks = {trees[t]["worker_bytes_per_token"] for t in LABELS}
    assert recorded["worker_bytes_per_token"] in blocks, (recorded, blocks)
    return {
        "host_bytes_per_token": recorded["host_bytes_per_token"] * groups,
        "recorded_host_bytes_per_token": recorded["host_bytes_per_token"],
        "offloaded_groups": groups,
    }


def merge(results: dict[str, dict]) -> list[dict]:
    recorded = recorded_033()
    rows = []
    for per_tree in zip(*(results[t]["rows"] for t in LABELS), strict=True):
        keys = {(r["arch"], r["tp"], r["dcp"], r["hosts"], r["pp"]) for r in per_tree}
        assert len(keys) == 1, keys  # every tree measures the same cases
        arch, tp, dcp, hosts, pp = keys.pop()
        trees = {
            tree: {k: v for k, v in r.items() if k not in KEY}
            for tree, r in zip(LABELS, per_tree, strict=True)
        }
        # The limit is the model's, in the blocks its base picks: every tree
        # of one base must find the same one (the hybrids' state blocks span
        # other token counts in 0.30.0 than in 0.34.0).
        for base in {b for _, b, _ in TREES}:
            limits = {
                trees[t].get("limit_bytes_per_token") for t, b, _ in TREES if b == base
            }
            assert len(limits) == 1, (arch, tp, dcp, hosts, pp, base, limits)
        row = {
            "arch": arch,
            "tp": tp,
            "dcp": dcp,
            "hosts": hosts,
            "pp": pp,
            # The current base's limit.
            "limit_bytes_per_token": trees[SERIES].get("limit_bytes_per_token"),
            **trees,
        }
        row[RECORDED] = _recorded_row(recorded.get((arch, tp, dcp)), trees, hosts, pp)
        rows.append(row)
    return rows


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def _ok(row: dict) -> bool:
    return not any("unsupported" in row[t] for t in (*LABELS, RECORDED))


def summary_rows(rows: list[dict]) -> list[dict]:
    """One row per model: at the TP size it is usually served at, on the hosts
    of 8 GPUs that size spans (TP 16: two), DCP 1."""
    usual = {a.name: (a.usual_tp, a.usual_hosts) for a in architectures.ARCHITECTURES}
    return [
        r
        for r in rows
        if r["dcp"] == 1
        and r["pp"] == 1
        and (r["tp"], r["hosts"]) == usual.get(r["arch"])
    ]


def _shape(row: dict) -> str:
    return architectures.shape(row["tp"], row["hosts"], row["pp"])


def _tokens(n: float) -> str:
    return f"{n:,.0f}"


def print_summary(rows: list[dict]) -> None:
    """What each model gains at its usual TP size: offloaded tokens that fit
    in 1 GiB of cpu_bytes_to_use, vLLM 0.34.0 against 0.34.0 with the series
    and the physical limit, and the series against the 0.33.0 series."""
    print(
        "Offloaded tokens per GiB of host memory (cpu_bytes_to_use, all hosts "
        "together), at each model's\nusual TP size, on hosts of 8 GPUs "
        "(hosts x GPUs per host):\n"
    )
    width = max(len(a.name) for a in architectures.ARCHITECTURES)
    head = (
        f"{'model':<{width}} {'TP':>3} {'hosts':>6} | {'0.34.0':>8} {'canonical':>9} "
        f"{'series':>8} {'limit':>8} | {'gain':>6} {'of limit':>8} | "
        f"{'vs 0.33.0 series':>16}"
    )
    print(head)
    print("-" * len(head))
    for row in summary_rows(rows):
        if not _ok(row):
            continue
        release, series = row[RELEASE], row[SERIES]
        canonical = release["canonical"]["worker"]["tokens_per_gib"]
        limit = GiB / row["limit_bytes_per_token"]
        previous = row[RECORDED]["host_bytes_per_token"]
        versus = (
            "-"
            if previous is None
            else f"{previous / series['host_bytes_per_token']:.2f}x"
        )
        print(
            f"{row['arch']:<{width}} {row['tp']:>3} {_shape(row):>6} | "
            f"{_tokens(release['tokens_per_gib']):>8} {_tokens(canonical):>9} "
            f"{_tokens(series['tokens_per_gib']):>8} {_tokens(limit):>8} | "
            f"{release['host_bytes_per_token'] / series['host_bytes_per_token']:>5.2f}x "
            f"{row['limit_bytes_per_token'] / series['host_bytes_per_token']:>7.0%} | "
            f"{versus:>16}"
        )
    print(
        "\n0.34.0: vLLM 0.34.0 as released (CPUOffloadingSpec); canonical: its "
        "canonical layout\n(TieringOffloadingSpec, canonical_layout), upstream's "
        "strongest configuration; series: 0.34.0\nwith this project's series; "
        "limit: every distinct piece of KV stored once on each host that\n"
        "holds a part of it; hosts: hosts x GPUs per host; gain: series over\n"
        "0.34.0; of limit: how close the series gets (both ratios of host bytes "
        "per token: the\ntoken columns count the whole chunks that fit in 1 GiB, "
        "and a chunk of a hybrid's Mamba state\ntakes over 100 MiB); vs 0.33.0 "
        "series: the "
        "0.33.0 series' host bytes\nper token (bench/results/0.33.0-series.json, "
        "its last demo, of one host:\n- on several) over the 0.34.0 series'. A "
        "chunk of tokens is a chunk of every offloaded KV cache\ngroup, in "
        "every column (earlier demos counted one group's chunk, which\noverstated models with several "
        "groups: DeepSeek-V4-like, the hybrids).\nEvery model at every TP and "
        "DCP size follows."
    )
    mixed = [
        row
        for row in summary_rows(rows)
        if _ok(row) and len(row[SERIES]["layer_classes"] or ()) > 1
    ]
    if not mixed:
        return
    print(
        "\nWhere a model's layer classes need different host copy counts, the "
        "copies each keeps with the\nseries (its host layout holds one copy of "
        "each layer per replica group of the layer's plan,\nwhich the engine "
        "names at start-up), and, for models with several KV cache groups, "
        "the host\nunits a chunk of every group takes:"
    )
    for row in mixed:
        series = row[SERIES]
        needs = ", ".join(
            f"{c['copies']} for "
            + " + ".join(f"{n} {what}" for what, n in c["layers"].items())
            + f" layer{'s' if sum(c['layers'].values()) > 1 else ''}"
            for c in series["layer_classes"]
        )
        layout = series["host_layout"]
        units = ""
        if len(layout["group_units"]) > 1:
            units = (
                f"; {sum(layout['group_units'])} units of "
                f"{layout['unit_bytes'] / 2**20:.2f} MiB"
            )
        on = f" ({_shape(row)}; copies per host)" if row["hosts"] > 1 else ""
        print(f"  {row['arch']}, TP {row['tp']}{on}: {needs}{units}")


def _tokens_cell(row: dict, mark: str = "") -> str:
    """A row's tokens per GiB: 0.34.0 (marked) -> series (limit)."""
    return (
        f"{_tokens(row[RELEASE]['tokens_per_gib']):>6}{mark} -> "
        f"{_tokens(row[SERIES]['tokens_per_gib']):>6} "
        f"({_tokens(GiB / row['limit_bytes_per_token']):>6})   "
    )


def print_hosts(rows: list[dict]) -> None:
    """Each model at TP 16 on one host and over several (DCP 1): tokens per
    GiB of cpu_bytes_to_use, all hosts together, vLLM 0.34.0 against the
    series and the limit counted per host."""
    several = [
        r for r in rows if r["hosts"] > 1 and r["pp"] == 1 and r["dcp"] == 1 and _ok(r)
    ]
    if not several:
        return
    print(
        "\nTP 16 on one host of 16 GPUs and over several hosts (DCP 1): "
        "offloaded tokens per GiB of\ncpu_bytes_to_use (all hosts together), "
        "0.34.0 -> series (limit); each host keeps its own\nworkers' copies, "
        "one per replica group on the host:"
    )
    width = max(len(r["arch"]) for r in several)
    shapes = sorted({r["hosts"] for r in rows if r["tp"] == 16 and r["pp"] == 1})
    print(
        f"  {'model':<{width}} | "
        + " | ".join(f"{architectures.shape(16, h):^27}" for h in shapes)
    )
    by_key = {tuple(r[k] for k in KEY): r for r in rows}
    for arch in dict.fromkeys(r["arch"] for r in several):
        cells = []
        for hosts in shapes:
            row = by_key.get((arch, 16, 1, hosts, 1))
            if row is None or not _ok(row):
                cells.append(f"{'-':^27}")
                continue
            cells.append(_tokens_cell(row))
        print(f"  {arch:<{width}} | " + " | ".join(cells))


def print_pipelines(rows: list[dict]) -> None:
    """Each model under pipeline parallelism (DCP 1): tokens per GiB of
    cpu_bytes_to_use, every stage's regions together, vLLM 0.34.0 against
    the series and the limit counted per host; marked where 0.34.0's stages
    are unsafe."""
    pipelined = [r for r in rows if r["pp"] > 1 and r["dcp"] == 1 and _ok(r)]
    if not pipelined:
        return
    deployments = sorted({(r["tp"], r["pp"], r["hosts"]) for r in pipelined})
    print(
        "\nPipeline parallelism (DCP 1): offloaded tokens per GiB of "
        "cpu_bytes_to_use (every stage's\nregions together), 0.34.0 -> series "
        "(limit); each stage keeps its own layers, one copy per\nreplica group "
        "of its workers on each host; ! where 0.34.0 is unsafe: its stages lay "
        "out\none region of a host differently, or with fewer rows than the "
        "scheduler hands out:"
    )
    width = max(len(r["arch"]) for r in pipelined)
    print(
        f"  {'model':<{width}} | "
        + " | ".join(
            f"{f'TP {tp} x PP {pp}, {architectures.shape(tp, hosts, pp)}':^28}"
            for tp, pp, hosts in deployments
        )
    )
    by_key = {tuple(r[k] for k in KEY): r for r in rows}
    for arch in dict.fromkeys(r["arch"] for r in pipelined):
        cells = []
        for tp, pp, hosts in deployments:
            row = by_key.get((arch, tp, 1, hosts, pp))
            if row is None or not _ok(row):
                cells.append(f"{'-':^28}")
                continue
            unsafe = " " if row[RELEASE]["stages_agree"] else "!"
            cells.append(_tokens_cell(row, unsafe))
        print(f"  {arch:<{width}} | " + " | ".join(cells))


def print_ray(rows: list[dict]) -> None:
    """Each model in its usual deployment under the Ray executor: tokens per
    GiB of cpu_bytes_to_use, vLLM 0.34.0 against the series, beside the
    series under the mp executor."""
    usual = [r for r in summary_rows(rows) if _ok(r) and "ray" in r[SERIES]]
    if not usual:
        return
    print(
        "\nThe same deployments under the Ray executor (--distributed-executor-"
        "backend ray): offloaded\ntokens per GiB of cpu_bytes_to_use; 0.34.0 "
        "knows no host of a Ray worker and keeps a copy per\nworker (its "
        "single-copy layout is the mp executor's); the series reads the node "
        "Ray records\nfor each worker and shares as under mp:"
    )
    width = max(len(r["arch"]) for r in usual)
    print(
        f"  {'model':<{width}} {'TP':>3} {'hosts':>6} | {'0.34.0 on Ray':>13}  "
        f"{'series on Ray':>13} | {'series on mp':>12}"
    )
    for row in usual:
        release, series = row[RELEASE]["ray"], row[SERIES]["ray"]
        print(
            f"  {row['arch']:<{width}} {row['tp']:>3} {_shape(row):>6} | "
            f"{_tokens(release['tokens_per_gib']):>13}  "
            f"{_tokens(series['tokens_per_gib']):>13} | "
            f"{_tokens(row[SERIES]['tokens_per_gib']):>12}"
        )


def plot_summary(rows: list[dict], path: Path) -> None:
    """The summary as a bar chart (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [r for r in summary_rows(rows) if _ok(r)]
    names = [f"{r['arch']}, TP {r['tp']} ({_shape(r)})" for r in lines]
    series = {
        "vLLM 0.34.0": [r[RELEASE]["tokens_per_gib"] for r in lines],
        "0.34.0 canonical layout": [
            r[RELEASE]["canonical"]["worker"]["tokens_per_gib"] for r in lines
        ],
        "0.34.0 + series": [r[SERIES]["tokens_per_gib"] for r in lines],
        "limit (distinct KV once)": [GiB / r["limit_bytes_per_token"] for r in lines],
    }
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(lines) + 1.5))
    height = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ys = [y + (i - (len(series) - 1) / 2) * height for y in range(len(lines))]
        ax.barh(ys, values, height, label=label)
    ax.set_xscale("log")
    ax.set_xlabel(
        "offloaded tokens that fit in 1 GiB of host memory\n"
        "(a chunk of tokens: a chunk of every offloaded KV cache group)"
    )
    ax.set_yticks(range(len(lines)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_title(
        "KV offloading, at each model's usual TP size, on hosts of 8 GPUs", fontsize=10
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.tight_layout()
    # The numbers drawn, so that a chart can be checked against the demo's.
    numbers = {
        name: {k: v[i] for k, v in series.items()}
        for i, name in enumerate(r["arch"] for r in lines)
    }
    fig.savefig(
        path,
        dpi=110,
        bbox_inches="tight",
        metadata={"Description": json.dumps(numbers, sort_keys=True)},
    )
    plt.close(fig)


def print_table(rows: list[dict]) -> None:
    # Column labels under each release, and the widths of the copy columns.
    short = ("rel", "seed", "series", "rel", "series")
    widths = [max(4, len(s)) for s in short]
    copies_w = sum(widths) + len(widths) - 1  # 0.30.0 spans the first three
    # Host KiB in the order of the releases: 0.30.0's three trees, the
    # 0.33.0 series (recorded), 0.34.0's two and the limit in its blocks.
    kib_short = (*short[:3], "series", *short[3:], "limit")
    kib_w = 9 * len(kib_short) - 1
    header = (
        f"{'TP':>3} {'DCP':>3} {'hosts':>6} | {'host copies':^{copies_w}} | "
        f"{'host KiB per offloaded token':^{kib_w}} | {'series/limit':^13} | "
        f"{'canonical':^9} | {'store KiB':^13}"
    )
    bases = (
        f"{'':>3} {'':>3} {'':>6} | {'0.30.0':<{sum(widths[:3]) + 3}}"
        f"{'0.34.0':<{sum(widths[3:]) + 1}} | {'0.30.0':<27}{'0.33.0':<9}"
        f"{'0.34.0':<{kib_w - 36}} "
        f"| {'0.30.0':>6} {'0.34.0':>6} | {'0.34.0':^9} | {'0.34.0 series':^13}"
    )
    sub = (
        f"{'':>3} {'':>3} {'':>6} | "
        + " ".join(f"{s:>{w}}" for s, w in zip(short, widths))
        + " | "
        + " ".join(f"{s:>8}" for s in kib_short)
        + f" | {'':>13} | {'copies':^9} | {'rank':>6} {'total':>6}"
    )
    arch = None
    # (Pipelines have a section of their own.)
    for row in (r for r in rows if r["pp"] == 1):
        if row["arch"] != arch:
            arch = row["arch"]
            print(f"\n{arch}\n{header}\n{bases}\n{sub}\n{'-' * len(header)}")
        lead = f"{row['tp']:>3} {row['dcp']:>3} {_shape(row):>6} | "
        unsupported = [
            f"{t}: {row[t]['unsupported']}" for t in LABELS if "unsupported" in row[t]
        ]
        if unsupported:
            print(f"{lead}not supported by vLLM {unsupported[0]}")
            continue
        trees = [row[t] for t in LABELS]
        copies = " ".join(f"{t['host_copies']:>{w}}" for w, t in zip(widths, trees))
        kib = " ".join(
            f"{'-' if t['host_bytes_per_token'] is None else _kib(t['host_bytes_per_token']):>8}"
            for t in (*trees[:3], row[RECORDED], *trees[3:])
        )
        # Each series over the limit in its own base's blocks.
        ratios = " ".join(
            f"{row[t]['host_bytes_per_token'] / row[t]['limit_bytes_per_token']:>5.2f}x"
            for t in ("0.30.0+series", SERIES)
        )
        canonical = row[RELEASE]["canonical"]
        worker, scheduler = canonical["worker"], canonical["scheduler"]
        # Worker / scheduler host copies, marked where the two sides disagree.
        canon = f"{worker['host_copies']}/{scheduler['host_copies']}"
        if not canonical["agree"]:
            canon += " !"
        series = row[SERIES]
        store = (
            f"{_kib(series['busiest_rank_store_bytes_per_token']):>6} "
            f"{_kib(series['store_bytes_per_token']):>6}"
        )
        print(
            f"{lead}{copies} | {kib} {_kib(row['limit_bytes_per_token']):>8} | "
            f"{ratios} | {canon:^9} | {store}"
        )
    print(
        "\nrel: the vLLM release as published (0.34.0 has upstream's own version "
        "of the seed);\nseed: 0.30.0 with the seed patches (up to "
        f"{SEED_LAST_PATCH});\nseries: with all of patches/<release>/series; "
        "0.33.0 series: as its last demo measured it\n(bench/results/"
        "0.33.0-series.json), converted to this accounting. Each other column "
        "comes from\nthat tree's own get_kv_cache_configs, "
        "build_offloading_config and CPUOffloadingSpec (1 GiB of\n"
        "cpu_bytes_to_use; tokens per GiB are in --json). A chunk of tokens is "
        "a chunk of EVERY offloaded\nKV cache group: the releases, the seed and "
        "the 0.30.0 series take a row (every copy of a\nworker's block) per "
        "group's chunk, the 0.34.0 series the host units of each group's chunk "
        "in its\nhost layout. hosts: hosts x GPUs per host; the releases and "
        "the 0.30.0 trees share nothing\nacross hosts, the 0.34.0 series keeps "
        "each host's copies in a region of its own. host copies:\nof each "
        "offloaded chunk, on all hosts together, one per group of TP ranks on "
        "one host that hold\nidentical KV (with a decimal point: "
        "averaged over the layers, weighted by their pages, where\neach layer "
        "keeps its own copies). limit: every distinct piece of KV stored once, "
        "padding\nexcluded (each layer's page: MLA-style caches once, GQA once "
        "per KV head, Mamba state once\nper rank, DCP token shards each once; "
        "on each host that holds a part of it), in 0.34.0's blocks; series/limit: host bytes of each\nseries over the "
        "limit in its own base's blocks (0.30.0 picks other blocks for the "
        "Qwen3.5- and\nNemotron-like hybrids; alignment shows as a little over "
        "1). canonical: host copies of\n0.34.0's canonical layout "
        "(TieringOffloadingSpec, canonical_layout) on a worker / on the\n"
        "scheduler, decided by the release's own build_offloading_config on "
        "each side's KV cache config;\n! where they disagree (the scheduler "
        "keeps one spec per group). store KiB: device-to-host\nbytes per "
        "offloaded token with the 0.34.0 series, from its host layout: written "
        "by the busiest\nrank and by all ranks together (the ranks holding one "
        "copy take turns, chunk by chunk)."
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
        print_hosts(rows)
        print_pipelines(rows)
        print_ray(rows)
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
