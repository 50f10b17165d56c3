"""The main job's numbers, from the five trees' real code (bench/demo.py),
through the README's own commands, `make demo ARGS=--json` and `make demo`,
run as a new user runs them: none of tools/testenv.sh's variables set, no
.venv-* on PATH, whatever /bin/sh is."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import demo  # noqa: E402

# The 0.30.0 trees: the release, with the seed patches, with the series.
TREES = ("0.30.0", "0.30.0+seed", "0.30.0+series")
SERIES = ("0.30.0+series", "0.33.0+series")


def user_env() -> dict[str, str]:
    """A new user's shell: PATH without the project's environments, HOME,
    nothing else (no test environment, no make or pytest state)."""
    venv_bins = {os.path.realpath(v / "bin") for v in ROOT.glob(".venv*")}
    path = [
        p
        for p in os.environ["PATH"].split(os.pathsep)
        if os.path.realpath(p) not in venv_bins
    ]
    return {"PATH": os.pathsep.join(path), "HOME": str(Path.home())}


def make(*args: str) -> str:
    res = subprocess.run(
        ["make", *args], cwd=ROOT, env=user_env(), capture_output=True, text=True
    )
    assert res.returncode == 0, f"make {' '.join(args)}:\n{res.stderr[-6000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def all_rows():
    # stdout is the JSON alone: the set-up reports on stderr.
    rows = json.loads(make("demo", "ARGS=--json"))
    return {(r["arch"], r["tp"], r["dcp"]): r for r in rows}


@pytest.fixture(scope="module")
def rows(all_rows):
    return {
        k: r
        for k, r in all_rows.items()
        if not any("unsupported" in r[t] for t in demo.LABELS)
    }


# Models whose layers all replicate alike (no draft or state of another kind).
UNIFORM = (
    "DeepSeek-V3 (MLA)",
    "DeepSeek-V3.2 (MLA + indexer)",
    "DeepSeek-V4-like (MLA + indexer + SWA)",
    "DeepSeek-V3 + MTP draft",
    "Llama-3.1-405B-like (GQA, 8 KV heads)",
    "GLM-4.5-like (GQA, 8 KV heads)",
    "Qwen3-235B-like (GQA, 4 KV heads)",
    "Qwen2.5-1.5B-like (GQA, 2 KV heads)",
)
MLA_ONLY = UNIFORM[:4]


def test_make_demo_prints_the_summary_then_the_table_of_these_numbers(all_rows):
    # Two models (the README's headlines), measured by the workers alone: a
    # filtered run prints exactly what the full run's JSON holds for them.
    models = ("DeepSeek-V3.2", "Qwen2.5")
    table = make("demo", "ARGS=" + " ".join(f"--model {m}" for m in models))
    shown = [r for r in all_rows.values() if r["arch"].startswith(models)]
    assert {r["arch"] for r in shown} == {
        "DeepSeek-V3.2 (MLA + indexer)",
        "Qwen2.5-1.5B-like (GQA, 2 KV heads)",
    }
    expected = io.StringIO()
    with contextlib.redirect_stdout(expected):
        demo.print_summary(shown)
        demo.print_table(shown)
    assert table == expected.getvalue()
    # The summary leads: one line per model, at its usual TP size.
    summary = table.split("\n\n")[1].splitlines()
    assert summary[0].startswith("model ") and len(summary) == 2 + len(models)
    full = io.StringIO()
    with contextlib.redirect_stdout(full):
        demo.print_summary(list(all_rows.values()))
    assert len(full.getvalue().split("\n\n")[1].splitlines()) == 2 + len(
        demo.architectures.ARCHITECTURES
    )

    def row(arch: str) -> list[str]:
        """The TP 8, DCP 1 row of `arch`: TP, DCP, host copies of the five
        trees, host KiB of the five trees and the limit, series/limit."""
        section = table.split(f"{arch}\n")[1].split("\n\n")[0]
        line = next(r for r in section.splitlines() if r.startswith("  8   1 |"))
        return line.replace("|", " ").replace(",", "").split()

    # The README's headlines. DeepSeek-V3.2 at TP 8 keeps one host copy
    # instead of eight with the seed, and 0.33.0 already does.
    fields = row("DeepSeek-V3.2 (MLA + indexer)")
    assert fields[2:7] == ["8", "1", "1", "1", "1"], fields
    base_kib, seed_kib, series_kib = map(float, fields[7:10])
    assert base_kib >= 7.9 * series_kib and seed_kib == series_kib, fields
    # 2 KV heads at TP 8: 0.33.0 keeps 8 host copies, its series 2.
    fields = row("Qwen2.5-1.5B-like (GQA, 2 KV heads)")
    assert fields[5:7] == ["8", "2"], fields
    assert float(fields[10]) == 4 * float(fields[11]), fields


def test_only_what_vllm_rejects_by_design_is_not_supported(all_rows):
    # vLLM's own assertions (bench/kv_tp_worker.py, REJECTED_BY_DESIGN), the
    # same in every tree: DCP with a sliding-window cache, and DCP with a
    # hybrid, whose attention blocks then span dcp times its state blocks'
    # tokens, no whole hash block.
    sliding_window = "AssertionError: DCP not support sliding window."
    hybrid_blocks = re.compile(
        r"AssertionError: tokens_per_block=(\d+) not divisible by "
        r"tokens_per_hash=(\d+)\. Hybrid models \(e\.g\. Mamba\+Attention\) "
        r"need --enable-prefix-caching to align block sizes\."
    )
    hybrids = (
        "MLA + Mamba hybrid",
        "Qwen3.5/Qwen3-Next-like (3 GDN : 1 attention, 2 KV heads)",
        "Nemotron-Nano-like (Mamba2 hybrid, 2 KV heads)",
        "Kimi-Linear-like (3 KDA : 1 MLA)",
    )
    for (arch, tp, dcp), row in all_rows.items():
        for tree in demo.LABELS:
            why = row[tree].get("unsupported")
            if dcp > 1 and arch.startswith("DeepSeek-V4-like"):
                assert why == sliding_window, (arch, tp, dcp, tree)
            elif dcp > 1 and arch in hybrids:
                assert why and (m := hybrid_blocks.fullmatch(why)), (arch, tree)
                assert int(m[2]) == dcp * int(m[1]), (arch, tp, dcp, tree)
            else:
                assert why is None, (arch, tp, dcp, tree, why)


def test_a_broken_environment_stops_the_demo_with_its_cause(tmp_path):
    # What `make demo` used to run when /bin/sh could not source
    # tools/testenv.sh: no model config where HF_HOME points, so every
    # ModelConfig fails validation. That is no "not supported" row.
    env = {
        **user_env(),
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path),
    }
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "demo.py"), "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode != 0
    assert res.stdout == ""
    assert "ValidationError: 1 validation error for ModelConfig" in res.stderr
    assert "worker failed" in res.stderr


def test_deepseek_v32_tp8_stores_one_host_copy_instead_of_eight(rows):
    row = rows[("DeepSeek-V3.2 (MLA + indexer)", 8, 1)]
    base, seed, series = (row[t] for t in TREES)
    assert not base["replicated_layout"]
    assert seed["replicated_layout"] and series["replicated_layout"]
    assert seed["kv_tp_replicas"] == series["kv_tp_replicas"] == 8
    # The base reserves one copy per rank, the seed one copy in all (host
    # chunks are rounded up to an alignment, hence not an exact ratio).
    assert base["host_bytes_per_token"] >= 8 * series["worker_bytes_per_token"]
    assert series["host_bytes_per_token"] < 1.01 * row["limit_bytes_per_token"]
    assert seed["tokens_per_gib"] >= 8 * base["tokens_per_gib"]


def test_two_kv_heads_at_tp8_store_a_quarter_of_the_base(rows):
    row = rows[("Qwen2.5-1.5B-like (GQA, 2 KV heads)", 8, 1)]
    base, seed, series = (row[t] for t in TREES)
    assert series["kv_tp_replicas"] == 4 and seed["kv_tp_replicas"] == 1
    assert seed["host_bytes_per_token"] == base["host_bytes_per_token"]
    assert series["host_bytes_per_token"] == base["host_bytes_per_token"] / 4
    assert series["host_bytes_per_token"] == pytest.approx(
        row["limit_bytes_per_token"], rel=0.01
    )


def test_never_below_the_physical_limit(rows):
    # Storing fewer bytes than the distinct KV would mean a false claim of
    # replication somewhere.
    for key, row in rows.items():
        for tree in demo.LABELS:
            assert (
                row[tree]["host_bytes_per_token"]
                >= 0.999 * row["limit_bytes_per_token"]
            ), (key, tree)


def test_at_the_limit_where_every_layer_replicates_alike(rows):
    for (arch, tp, dcp), row in rows.items():
        if arch in UNIFORM:
            assert row["0.30.0+series"]["host_bytes_per_token"] == pytest.approx(
                row["limit_bytes_per_token"], rel=0.01
            ), (arch, tp, dcp)


@pytest.mark.parametrize(
    "arch, tp, dcp, groups",
    [
        ("DeepSeek-V3 (MLA)", 8, 2, [0, 1] * 4),
        ("DeepSeek-V3 (MLA)", 16, 2, [0, 1] * 8),
        ("DeepSeek-V3.2 (MLA + indexer)", 16, 2, [0, 1] * 8),
        ("DeepSeek-V3.2 (MLA + indexer)", 8, 4, [0, 1, 2, 3] * 2),
        ("Qwen2.5-1.5B-like (GQA, 2 KV heads)", 16, 2, [0, 1] * 4 + [2, 3] * 4),
        ("Qwen3-235B-like (GQA, 4 KV heads)", 16, 2, [0, 1] * 2 + [2, 3] * 2
         + [4, 5] * 2 + [6, 7] * 2),
    ],
)  # fmt: skip
def test_dcp_keeps_one_host_copy_per_strided_replica_group(rows, arch, tp, dcp, groups):
    # Under DCP, ranks with one DCP rank hold the same token share: both
    # series keep one copy per such group, at the physical limit; the
    # releases and the seed one per rank.
    row = rows[(arch, tp, dcp)]
    for series in SERIES:
        r = row[series]
        assert r["kv_tp_replica_groups"] == groups, series
        assert r["kv_tp_replicas"] == 1, series
        assert r["host_copies"] == len(set(groups)), series
        assert r["host_bytes_per_token"] == pytest.approx(
            row["limit_bytes_per_token"], rel=0.01
        ), series
    assert row["0.33.0"]["host_copies"] == tp
    base, seed, series = (row[t] for t in TREES)
    assert base["host_copies"] == seed["host_copies"] == tp
    assert (
        base["host_bytes_per_token"]
        >= tp / len(set(groups)) * 0.99 * (series["host_bytes_per_token"])
    )


def test_unproven_replication_is_unchanged(rows):
    # Where a 0.30.0 tree claims no two ranks identical, it offloads as the
    # release.
    for key, row in rows.items():
        for tree in TREES[1:]:
            r = row[tree]
            groups = r["kv_tp_replica_groups"] or range(key[1])
            if r["kv_tp_replicas"] == 1 and len(set(groups)) == key[1]:
                expected = {
                    **row["0.30.0"],
                    "kv_tp_replicas": 1,
                    "kv_tp_replica_groups": r["kv_tp_replica_groups"],
                }
                assert r == expected, (key, tree)


def test_base_tree_has_no_replica_count(rows):
    assert all(r["0.30.0"].get("kv_tp_replicas") is None for r in rows.values())


def test_033_two_kv_heads_at_tp8_store_two_copies_instead_of_eight(rows):
    # What users of today's vLLM gain: 0.33.0 keeps one host copy per rank
    # of a GQA model whose KV heads repeat across ranks; with the series, one
    # per KV head (runs of 4 ranks share one).
    row = rows[("Qwen2.5-1.5B-like (GQA, 2 KV heads)", 8, 1)]
    release, series = row["0.33.0"], row["0.33.0+series"]
    assert release["host_copies"] == 8 and release["kv_tp_replicas"] == 1
    assert series["host_copies"] == 2 and series["kv_tp_replicas"] == 4
    assert series["host_bytes_per_token"] == release["host_bytes_per_token"] / 4
    assert series["host_bytes_per_token"] == pytest.approx(
        row["limit_bytes_per_token"], rel=0.01
    )


def test_033_series_reaches_the_limit(rows):
    # Every model whose layers all replicate alike, with and without DCP.
    for (arch, tp, dcp), row in rows.items():
        if arch in UNIFORM:
            assert row["0.33.0+series"]["host_bytes_per_token"] == pytest.approx(
                row["limit_bytes_per_token"], rel=0.01
            ), (arch, tp, dcp)


# Mixes whose classes share one KV cache group: a target and its draft, MLA
# beside GQA. The others are hybrids, whose state is a KV cache group apart.
ONE_GROUP_MIXES = (
    "MLA + GQA-8 mix",
    "DeepSeek-V3 + EAGLE-3 draft (8 KV heads)",
    "Qwen3-235B-like + EAGLE-3 draft (8 KV heads)",
)


def test_033_series_reaches_the_limit_where_classes_share_a_group(rows):
    """Where the layers of one KV cache group need different host copy
    counts, each keeps its own (layer_copies), at every TP and DCP size:
    the limit, up to the row's page alignment. Only those mixes do; the
    hybrids keep one layout."""
    with_layer_copies = set()
    for (arch, tp, dcp), row in rows.items():
        series = row["0.33.0+series"]
        assert not row["0.33.0"]["layer_copies"]
        if series["layer_copies"]:
            with_layer_copies.add(arch)
            assert series["host_bytes_per_token"] == pytest.approx(
                row["limit_bytes_per_token"], rel=0.01
            ), (arch, tp, dcp)
            assert len(series["layer_classes"]) > 1
        elif arch in ONE_GROUP_MIXES:
            # One class only: TP 1, or at TP 16 under DCP where no two
            # ranks share anything.
            assert len(series["layer_classes"]) == 1, (arch, tp, dcp)
    assert with_layer_copies == set(ONE_GROUP_MIXES)


# Hybrids: attention beside linear-attention or Mamba state, KV cache groups
# apart.
HYBRIDS = (
    "MLA + Mamba hybrid",
    "Qwen3.5/Qwen3-Next-like (3 GDN : 1 attention, 2 KV heads)",
    "Nemotron-Nano-like (Mamba2 hybrid, 2 KV heads)",
    "Kimi-Linear-like (3 KDA : 1 MLA)",
)


def test_033_series_reaches_the_limit_where_hybrid_groups_replicate_differently(
    rows,
):
    """Where the KV cache groups of a hybrid need different host copy
    counts, each keeps its own (group_copies), at every TP and DCP size: the
    limit, up to the unit's page alignment, and more tokens than the
    release. Only the hybrids do."""
    with_group_copies = set()
    for (arch, tp, dcp), row in rows.items():
        series = row["0.33.0+series"]
        assert not row["0.33.0"]["group_copies"]
        if series["group_copies"]:
            with_group_copies.add(arch)
            assert not series["layer_copies"]
            assert series["host_bytes_per_token"] == pytest.approx(
                row["limit_bytes_per_token"], rel=0.01
            ), (arch, tp, dcp)
            assert len(series["layer_classes"]) > 1
            # Better than the release wherever it keeps more than one copy.
            assert series["tokens_per_gib"] > row["0.33.0"]["tokens_per_gib"]
    assert with_group_copies == set(HYBRIDS)


def test_033_series_keeps_what_the_release_already_dedups(rows):
    # MLA-style models: 0.33.0 itself keeps one copy; the series keeps that.
    for (arch, tp, dcp), row in rows.items():
        if arch in MLA_ONLY and dcp == 1 and tp > 1:
            assert row["0.33.0"]["host_copies"] == 1, (arch, tp)
            assert _cpu_offloading(row["0.33.0+series"]) == _cpu_offloading(
                row["0.33.0"]
            ), (arch, tp)


def _cpu_offloading(result: dict) -> dict:
    """What CPUOffloadingSpec reserves (the canonical layout, and the replica
    groups and layer classes, which the release does not plan, apart: see
    test_layer_classes_need_what_each_layer_splits_into; and the busiest
    rank's store traffic, which the series spreads over the ranks sharing a
    copy: see test_store_traffic_is_one_page_per_copy)."""
    return {
        k: v
        for k, v in result.items()
        if k
        not in (
            "canonical",
            "kv_tp_replica_groups",
            "layer_classes",
            "busiest_rank_store_bytes_per_token",
        )
    }


def test_033_unproven_replication_is_unchanged(rows):
    # Where the 0.33.0 series proves no two ranks identical, it offloads
    # exactly as the release.
    for key, row in rows.items():
        series = row["0.33.0+series"]
        if (
            series["kv_tp_replicas"] == 1
            and not series["kv_tp_replica_groups"]
            and not series["layer_copies"]
            and not series["group_copies"]
        ):
            assert _cpu_offloading(row["0.33.0+series"]) == _cpu_offloading(
                row["0.33.0"]
            ), key


def test_033_series_canonical_layout_agrees_on_both_sides(rows):
    # The release's scheduler and workers may size the canonical layout
    # differently; with the series they never do.
    for key, row in rows.items():
        assert row["0.33.0+series"]["canonical"]["agree"], key
    assert any(not row["0.33.0"]["canonical"]["agree"] for row in rows.values())


def _mean_limit(row: dict, pieces: dict[int, int]) -> float:
    """The physical limit from one rank's bytes per token, when every layer's
    page is the same size (a hybrid's pages are padded to one size): the mean
    distinct pieces of the layers, or of a hybrid's KV cache groups (a chunk
    of tokens is a chunk of every group), `pieces` {count: layers or
    groups}."""
    n = sum(pieces.values())
    distinct = sum(count * k for count, k in pieces.items()) / n
    return row["0.33.0+series"]["worker_bytes_per_token"] * distinct


def test_realistic_mixes_against_an_independent_count_of_distinct_kv(rows):
    # A DeepSeek-V3 target (61 MLA layers: a 1152-byte latent per token, the
    # same on every rank) with a Llama EAGLE-3 draft layer (8 KV heads of
    # 128, bf16: one head of 512 bytes per token and rank at TP 8, 8 heads).
    row = rows[("DeepSeek-V3 + EAGLE-3 draft (8 KV heads)", 8, 1)]
    assert row["limit_bytes_per_token"] == 61 * 1152 + 8 * 512
    # The same with its MTP layer (one more MLA layer).
    row = rows[("DeepSeek-V3 + MTP draft", 8, 1)]
    assert row["limit_bytes_per_token"] == 62 * 1152
    # Qwen3-235B-like (94 layers, 4 KV heads) with an 8-head draft at TP 8.
    row = rows[("Qwen3-235B-like + EAGLE-3 draft (8 KV heads)", 8, 1)]
    assert row["limit_bytes_per_token"] == (94 * 4 + 8) * 512
    # Hybrids, TP 8: each state is per rank (8 pieces), each attention layer
    # has 2 KV heads; vLLM pads every page to one size and groups the layers
    # in KV cache groups of as many layers as the model has attention layers
    # (the last group of state padded), each group's chunk one block.
    row = rows[("Qwen3.5/Qwen3-Next-like (3 GDN : 1 attention, 2 KV heads)", 8, 1)]
    assert row["limit_bytes_per_token"] == pytest.approx(
        _mean_limit(row, {8: 36, 2: 12})
    )
    assert row["limit_bytes_per_token"] == pytest.approx(
        _mean_limit(row, {8: 3, 2: 1})
    )
    # 27 Mamba2 layers in 7 groups of 4, 4 attention layers in one.
    row = rows[("Nemotron-Nano-like (Mamba2 hybrid, 2 KV heads)", 8, 1)]
    assert row["limit_bytes_per_token"] == pytest.approx(
        _mean_limit(row, {8: 7, 2: 1})
    )
    # Kimi-Linear-like: 20 KDA layers (per rank) in 3 groups of 7, 7 MLA
    # layers (one latent for all ranks) in one, at TP 8 and 16.
    for tp in (8, 16):
        row = rows[("Kimi-Linear-like (3 KDA : 1 MLA)", tp, 1)]
        assert row["limit_bytes_per_token"] == pytest.approx(
            _mean_limit(row, {tp: 3, 1: 1})
        )


def test_canonical_column_is_what_each_release_decides_on_each_side(rows):
    # 0.33.0's canonical layout on a target with a draft at TP 8: its
    # scheduler sees one spec per group (MLA) and keeps one host copy, its
    # workers eight; with the series both sides keep eight.
    row = rows[("DeepSeek-V3 + EAGLE-3 draft (8 KV heads)", 8, 1)]
    release = row["0.33.0"]["canonical"]
    assert (release["worker"]["host_copies"], release["scheduler"]["host_copies"]) == (
        8,
        1,
    )
    assert not release["agree"]
    series = row["0.33.0+series"]["canonical"]
    assert series["agree"] and series["worker"]["host_copies"] == 8
    # Where every layer is MLA, the canonical layout keeps one copy on both.
    for tree in ("0.33.0", "0.33.0+series"):
        canonical = rows[("DeepSeek-V3 (MLA)", 8, 1)][tree]["canonical"]
        assert canonical["agree"] and canonical["worker"]["host_copies"] == 1


def test_store_traffic_is_one_page_per_copy(rows):
    for key, row in rows.items():
        tp = key[1]
        for tree in demo.LABELS:
            r = row[tree]
            if r["layer_copies"] or r["group_copies"]:
                # Each layer's (each group's) copies written once, every
                # distinct piece of KV once, and the ranks of each replica
                # group take turns.
                assert r["store_bytes_per_token"] == pytest.approx(
                    row["limit_bytes_per_token"], rel=0.01
                ), key
                assert r["busiest_rank_store_bytes_per_token"] * tp == (
                    pytest.approx(r["store_bytes_per_token"])
                ), key
                continue
            assert r["store_bytes_per_token"] == (
                r["host_copies"] * r["worker_bytes_per_token"]
            ), (key, tree)
            # With the 0.33.0 series the ranks sharing a host copy (equal
            # groups at these TP sizes) take turns writing it; elsewhere one
            # rank writes each copy whole.
            turns = tp // r["host_copies"] if tree == "0.33.0+series" else 1
            busiest = r["busiest_rank_store_bytes_per_token"]
            assert busiest * turns == r["worker_bytes_per_token"], (key, tree)


def test_the_chart_shows_the_summary(all_rows, tmp_path):
    from PIL import Image

    path = tmp_path / "summary.png"
    demo.plot_summary(list(all_rows.values()), path)
    drawn = json.loads(Image.open(path).info["Description"])
    for row in demo.summary_rows(list(all_rows.values())):
        numbers = drawn[row["arch"]]
        assert numbers["vLLM 0.33.0"] == row["0.33.0"]["tokens_per_gib"]
        assert numbers["0.33.0 + series"] == row["0.33.0+series"]["tokens_per_gib"]
    # The README's chart is this one (regenerate it with
    # `make demo ARGS="--plot docs/demo-summary.png"`).
    readme_chart = json.loads(
        Image.open(ROOT / "docs" / "demo-summary.png").info["Description"]
    )
    assert readme_chart == drawn


def test_layer_classes_need_what_each_layer_splits_into(rows, all_rows):
    """Per class of layers (equal replica groups, planned per layer by the
    0.33.0 series), the host copies the class needs are the distinct pieces
    each of its layers splits into by the model's math, every layer counted
    once. Where one host layout serves every class (the hybrids), it keeps
    never fewer copies than any class needs; where each class keeps its own
    (layer_copies), the page-weighted average lies between the fewest and
    the most. Only the mixes have more than one class, and the
    release plans none."""
    archs = {a.name: a for a in demo.architectures.ARCHITECTURES}
    mixed = set()
    for (name, tp, dcp), row in rows.items():
        arch, series = archs[name], row["0.33.0+series"]
        assert row["0.33.0"]["layer_classes"] is None
        counted: dict[str, int] = {}
        for layer_class in series["layer_classes"]:
            for what, count in layer_class["layers"].items():
                kind = what.split()[0]
                pieces = demo.architectures.distinct_shards(kind, arch, tp, dcp)
                assert layer_class["copies"] == pieces, (name, tp, dcp, what)
                counted[kind] = counted.get(kind, 0) + count
            if not (series["layer_copies"] or series["group_copies"]):
                assert series["host_copies"] >= layer_class["copies"]
        if series["layer_copies"] or series["group_copies"]:
            # Each class keeps its own: between the fewest and the most.
            needs = [c["copies"] for c in series["layer_classes"]]
            assert min(needs) <= series["host_copies"] <= max(needs)
        caches = {"dsv32": 2, "dsv4": 3}
        assert counted == {
            kind: arch.layers.count(kind) * caches.get(kind, 1)
            for kind in set(arch.layers)
        }
        if len(series["layer_classes"]) > 1:
            mixed.add(name)
    assert mixed == {a.name for a in archs.values()} - set(UNIFORM)
    # The summary names the classes of exactly these rows, at the usual TP.
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        demo.print_summary(list(all_rows.values()))
    classes = text.getvalue().split("in host units that all groups share:\n")[1]
    assert [line.split(", TP ")[0].strip() for line in classes.splitlines()] == [
        a.name for a in demo.architectures.ARCHITECTURES if a.name in mixed
    ]
    assert (
        "  DeepSeek-V3 + EAGLE-3 draft (8 KV heads), TP 8: 1 for 61 mla layers, "
        "8 for 1 draft layer; each class keeps its own" in classes.splitlines()
    )
