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
SERIES = ("0.30.0+series", demo.SERIES)
# The current base: its release and its series.
RELEASE, SERIES_034 = demo.RELEASE, demo.SERIES


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
def every_row():
    # stdout is the JSON alone: the set-up reports on stderr.
    rows = json.loads(make("demo", "ARGS=--json"))
    return {tuple(r[k] for k in demo.KEY): r for r in rows}


@pytest.fixture(scope="module")
def all_rows(every_row):
    """The rows of one host without PP, by (arch, TP, DCP)."""
    return {k[:3]: r for k, r in every_row.items() if k[3:] == (1, 1)}


def _supported(rows: dict) -> dict:
    return {
        k: r
        for k, r in rows.items()
        if not any("unsupported" in r[t] for t in demo.LABELS)
    }


@pytest.fixture(scope="module")
def rows(all_rows):
    return _supported(all_rows)


@pytest.fixture(scope="module")
def host_rows(every_row):
    """The supported rows of several hosts without PP, by (arch, TP, DCP,
    hosts)."""
    return _supported(
        {k[:4]: r for k, r in every_row.items() if k[3] > 1 and k[4] == 1}
    )


@pytest.fixture(scope="module")
def pp_rows(every_row):
    """The supported rows with PP, by (arch, TP, DCP, hosts, PP)."""
    return _supported({k: r for k, r in every_row.items() if k[4] > 1})


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
# Mixes whose classes share one KV cache group: a target and its draft, MLA
# beside GQA.
ONE_GROUP_MIXES = (
    "MLA + GQA-8 mix",
    "DeepSeek-V3 + EAGLE-3 draft (8 KV heads)",
    "Qwen3-235B-like + EAGLE-3 draft (8 KV heads)",
)
# Hybrids: attention beside linear-attention or Mamba state, KV cache groups
# apart.
HYBRIDS = (
    "MLA + Mamba hybrid",
    "Qwen3.5/Qwen3-Next-like (3 GDN : 1 attention, 2 KV heads)",
    "Nemotron-Nano-like (Mamba2 hybrid, 2 KV heads)",
    "Kimi-Linear-like (3 KDA : 1 MLA)",
)


def test_make_demo_prints_the_summary_then_the_table_of_these_numbers(every_row):
    # Two models (the README's headlines), measured by the workers alone: a
    # filtered run prints exactly what the full run's JSON holds for them.
    models = ("DeepSeek-V3.2", "Qwen2.5")
    table = make("demo", "ARGS=" + " ".join(f"--model {m}" for m in models))
    shown = [r for r in every_row.values() if r["arch"].startswith(models)]
    assert {r["arch"] for r in shown} == {
        "DeepSeek-V3.2 (MLA + indexer)",
        "Qwen2.5-1.5B-like (GQA, 2 KV heads)",
    }
    expected = io.StringIO()
    with contextlib.redirect_stdout(expected):
        demo.print_summary(shown)
        demo.print_hosts(shown)
        demo.print_pipelines(shown)
        demo.print_ray(shown)
        demo.print_table(shown)
    assert table == expected.getvalue()
    # The summary leads: one line per model, at its usual TP size.
    summary = table.split("\n\n")[1].splitlines()
    assert summary[0].startswith("model ") and len(summary) == 2 + len(models)
    full = io.StringIO()
    with contextlib.redirect_stdout(full):
        demo.print_summary(list(every_row.values()))
    assert len(full.getvalue().split("\n\n")[1].splitlines()) == 2 + len(
        demo.architectures.ARCHITECTURES
    )

    def row(arch: str) -> list[str]:
        """The TP 8, DCP 1 row of `arch` (one host of 8): TP, DCP, host
        copies of the five trees, host KiB of the three 0.30.0 trees, the
        0.33.0 series, the two 0.34.0 trees and the limit, series/limit of
        both series."""
        section = table.split(f"{arch}\n")[1].split("\n\n")[0]
        line = next(r for r in section.splitlines() if r.startswith("  8   1  1 x 8 |"))
        return line.replace(" 1 x 8 ", " ").replace("|", " ").replace(",", "").split()

    # The README's headlines. DeepSeek-V3.2 at TP 8 keeps one host copy
    # instead of eight with the seed, and 0.34.0 already does.
    fields = row("DeepSeek-V3.2 (MLA + indexer)")
    assert fields[2:7] == ["8", "1", "1", "1", "1"], fields
    base_kib, seed_kib, series_kib = map(float, fields[7:10])
    assert base_kib >= 7.9 * series_kib and seed_kib == series_kib, fields
    # 2 KV heads at TP 8: 0.34.0 keeps 8 host copies, its series 2, as the
    # 0.33.0 series did.
    fields = row("Qwen2.5-1.5B-like (GQA, 2 KV heads)")
    assert fields[5:7] == ["8", "2"], fields
    assert float(fields[11]) == 4 * float(fields[12]) == 4 * float(fields[10])
    assert fields[14:16] == ["1.00x", "1.00x"], fields


def test_only_what_vllm_rejects_by_design_is_not_supported(every_row):
    # vLLM's own assertions (bench/kv_tp_worker.py, REJECTED_BY_DESIGN), the
    # same in every tree and in the 0.33.0 series' record: DCP with a
    # sliding-window cache, and DCP with a hybrid, whose attention blocks
    # then span dcp times its state blocks' tokens, no whole hash block.
    sliding_window = "AssertionError: DCP not support sliding window."
    hybrid_blocks = re.compile(
        r"AssertionError: tokens_per_block=(\d+) not divisible by "
        r"tokens_per_hash=(\d+)\. Hybrid models \(e\.g\. Mamba\+Attention\) "
        r"need --enable-prefix-caching to align block sizes\."
    )
    for (arch, tp, dcp, hosts, pp), row in every_row.items():
        for tree in (*demo.LABELS, demo.RECORDED):
            if (hosts > 1 or pp > 1) and tree == demo.RECORDED:
                continue
            why = row[tree].get("unsupported")
            if dcp > 1 and arch.startswith("DeepSeek-V4-like"):
                assert why == sliding_window, (arch, tp, dcp, tree)
            elif dcp > 1 and arch in HYBRIDS:
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
        # 0.34.0's CPU platform accepts the installed Triton (as
        # tools/testenv.sh sets it): the model config is the only cause.
        "CUDA_VISIBLE_DEVICES": "",
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
    assert series["host_bytes_per_token"] < 1.01 * series["limit_bytes_per_token"]
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


def test_one_accounting_a_chunk_of_every_group(rows):
    """Every tree reserves, per chunk of tokens, a chunk of every offloaded
    KV cache group: a row of the spec each where it has no host layout, the
    units of each group's chunk in the 0.34.0 series'; and the tokens that
    fit in 1 GiB are whole chunks of every group."""
    for key, row in rows.items():
        for tree in demo.LABELS:
            r = row[tree]
            groups = r["offloaded_groups"]
            layout = r.get("host_layout")
            if tree == SERIES_034:
                assert layout is not None and len(layout["group_units"]) == groups
                assert r["host_units_per_chunk"] == sum(layout["group_units"])
                # Each group's units hold every copy of every layer.
                assert all(
                    units * layout["unit_bytes"] >= size
                    for units, size in zip(
                        layout["group_units"], layout["group_bytes"], strict=True
                    )
                ), key
                row_bytes = layout["unit_bytes"]
            else:
                assert layout is None, (key, tree)
                assert r["host_units_per_chunk"] == groups, (key, tree)
                row_bytes = r["host_bytes_per_chunk"] // groups
            assert r["host_bytes_per_chunk"] == r["host_units_per_chunk"] * row_bytes
            assert r["host_bytes_per_token"] == (
                r["host_bytes_per_chunk"] / r["tokens_per_chunk"]
            )
            assert r["tokens_per_gib"] == (
                (1 << 30) // r["host_bytes_per_chunk"] * r["tokens_per_chunk"]
            ), (key, tree)
        # The models with several offloaded groups (every TP size, DCP 1).
        if key[2] == 1 and key[0] in (
            *HYBRIDS,
            "DeepSeek-V4-like (MLA + indexer + SWA)",
        ):
            assert row[SERIES_034]["offloaded_groups"] > 1, key


def test_earlier_demos_overstated_models_with_several_groups(rows):
    # DeepSeek-V4-like at TP 8: the 0.33.0 demo counted one row (a chunk of
    # one of its two groups) per chunk of tokens: fewer bytes than the
    # model's distinct KV, which no layout can hold. A chunk of both groups
    # is two rows, as 0.34.0 reserves them; the 0.34.0 series packs both
    # groups' pages in host units, near the limit.
    row = rows[("DeepSeek-V4-like (MLA + indexer + SWA)", 8, 1)]
    recorded, release = row[demo.RECORDED], row[RELEASE]
    assert recorded["offloaded_groups"] == release["offloaded_groups"] == 2
    assert recorded["recorded_host_bytes_per_token"] < row["limit_bytes_per_token"]
    assert recorded["host_bytes_per_token"] == release["host_bytes_per_token"]
    series = row[SERIES_034]
    assert series["host_bytes_per_token"] < 0.65 * release["host_bytes_per_token"]


def test_never_below_the_physical_limit(rows):
    # Storing fewer bytes than the distinct KV would mean a false claim of
    # replication somewhere. Each tree against the limit in its own base's
    # blocks.
    for key, row in rows.items():
        for tree in demo.LABELS:
            r = row[tree]
            assert r["host_bytes_per_token"] >= 0.999 * r["limit_bytes_per_token"], (
                key,
                tree,
            )
        assert row[SERIES_034]["limit_bytes_per_token"] == row["limit_bytes_per_token"]


def test_034_series_within_1_01_of_the_limit_and_no_worse_than_033(rows):
    """The key claim: in every row, the 0.34.0 series reserves at most 1.01
    times the physical limit, and no more host bytes per token (a chunk of
    every group per chunk of tokens) than the 0.33.0 series did. Every
    failing row is named with its numbers."""
    failures = []
    for (arch, tp, dcp), row in sorted(rows.items()):
        series = row[SERIES_034]["host_bytes_per_token"]
        limit = row["limit_bytes_per_token"]
        previous = row[demo.RECORDED]["host_bytes_per_token"]
        if series > 1.01 * limit:
            failures.append(
                f"{arch}, TP {tp}, DCP {dcp}: {series:.1f} host bytes per token, "
                f"{series / limit:.4f} times the limit {limit:.1f}"
            )
        if series > previous * (1 + 1e-12):
            failures.append(
                f"{arch}, TP {tp}, DCP {dcp}: {series:.1f} host bytes per token, "
                f"the 0.33.0 series {previous:.1f}"
            )
    assert not failures, "\n".join(failures)


def test_at_the_limit_where_every_layer_replicates_alike(rows):
    # Both series, except the 0.30.0 series where a model offloads several
    # KV cache groups (DeepSeek-V4-like): a row per group's chunk, each a
    # whole block of the largest group, where the 0.34.0 series packs each
    # group's own pages.
    for (arch, tp, dcp), row in rows.items():
        if arch in UNIFORM:
            for tree in SERIES:
                r = row[tree]
                if tree == "0.30.0+series" and r["offloaded_groups"] > 1:
                    assert r["host_bytes_per_token"] > 1.5 * r["limit_bytes_per_token"]
                    continue
                assert r["host_bytes_per_token"] == pytest.approx(
                    r["limit_bytes_per_token"], rel=0.01
                ), (arch, tp, dcp, tree)


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
    # series keep one copy per such group, at the physical limit (the 0.30.0
    # series plans one replica group for every layer, the 0.34.0 series each
    # layer's, here the same for all); the releases and the seed one per
    # rank.
    row = rows[(arch, tp, dcp)]
    old, new = row["0.30.0+series"], row[SERIES_034]
    assert old["kv_tp_replica_groups"] == groups
    assert [c["replica_groups"] for c in new["layer_classes"]] == [groups]
    for r in (old, new):
        assert r["kv_tp_replicas"] == 1
        assert r["host_copies"] == len(set(groups))
        assert r["host_bytes_per_token"] == pytest.approx(
            r["limit_bytes_per_token"], rel=0.01
        )
    assert row[RELEASE]["host_copies"] == tp
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


def test_034_two_kv_heads_at_tp8_store_two_copies_instead_of_eight(rows):
    # What users of today's vLLM gain: 0.34.0 keeps one host copy per rank
    # of a GQA model whose KV heads repeat across ranks; with the series, one
    # per KV head (runs of 4 ranks share one).
    row = rows[("Qwen2.5-1.5B-like (GQA, 2 KV heads)", 8, 1)]
    release, series = row[RELEASE], row[SERIES_034]
    assert release["host_copies"] == 8 and release["kv_tp_replicas"] == 1
    assert series["host_copies"] == 2 and series["kv_tp_replicas"] == 4
    assert series["layer_classes"][0]["replica_groups"] == [0] * 4 + [1] * 4
    assert series["host_bytes_per_token"] == release["host_bytes_per_token"] / 4
    assert series["host_bytes_per_token"] == pytest.approx(
        row["limit_bytes_per_token"], rel=0.01
    )


def test_034_series_reaches_the_limit_where_classes_share_a_group(rows):
    """Where the layers of one KV cache group need different host copy
    counts, each keeps its own in the host layout, at every TP and DCP size:
    the limit, up to the unit's alignment. The layers form as many classes
    as their kinds split into different numbers of pieces (one where they
    split alike: TP 1; 4 and 8 KV heads at TP 2 and 4; no sharing at TP 16
    under DCP). Only those mixes have more than one class in one group."""
    archs = {a.name: a for a in demo.architectures.ARCHITECTURES}
    for (arch, tp, dcp), row in rows.items():
        series = row[SERIES_034]
        if arch in ONE_GROUP_MIXES:
            assert series["offloaded_groups"] == 1
            assert series["host_bytes_per_token"] == pytest.approx(
                row["limit_bytes_per_token"], rel=0.01
            ), (arch, tp, dcp)
            pieces = {
                demo.architectures.distinct_shards(kind, archs[arch], tp, dcp)
                for kind in archs[arch].layers
            }
            assert len(series["layer_classes"]) == len(pieces), (arch, tp, dcp)
        elif series["offloaded_groups"] == 1:
            assert arch in UNIFORM and len(series["layer_classes"]) == 1, arch


def test_034_series_reaches_the_limit_where_hybrid_groups_replicate_differently(
    rows,
):
    """Where the KV cache groups of a hybrid need different host copy counts,
    a chunk of each takes its own host units, at every TP size: the limit, up
    to the unit's alignment, and fewer host bytes per token than the release
    (whose row per group's chunk holds a whole padded block of every rank);
    as many tokens or more in 1 GiB, which holds few whole chunks of every
    group (tens of MiB each)."""
    archs = {a.name: a for a in demo.architectures.ARCHITECTURES}
    seen = set()
    for (arch, tp, dcp), row in rows.items():
        if arch not in HYBRIDS:
            continue
        seen.add(arch)
        series, release = row[SERIES_034], row[RELEASE]
        units = series["host_layout"]["group_units"]
        assert len(units) == series["offloaded_groups"] > 1
        assert series["host_bytes_per_token"] == pytest.approx(
            row["limit_bytes_per_token"], rel=0.01
        ), (arch, tp, dcp)
        assert series["host_bytes_per_token"] < release["host_bytes_per_token"]
        assert series["tokens_per_gib"] >= release["tokens_per_gib"], (arch, tp)
        # A class per number of pieces the layers split into (one at TP 1,
        # and for 2 KV heads at TP 2).
        pieces = {
            demo.architectures.distinct_shards(kind, archs[arch], tp, dcp)
            for kind in archs[arch].layers
        }
        assert len(series["layer_classes"]) == len(pieces), (arch, tp)
    assert seen == set(HYBRIDS)


def test_034_series_keeps_what_the_release_already_dedups(rows):
    # MLA-style models: 0.34.0 itself keeps one copy; the series keeps that,
    # the same row where the model has one group, less where a
    # DeepSeek-V4-like model's two groups share host units.
    for (arch, tp, dcp), row in rows.items():
        if arch in MLA_ONLY and dcp == 1 and tp > 1:
            release, series = row[RELEASE], row[SERIES_034]
            assert release["host_copies"] == series["host_copies"] == 1, (arch, tp)
            assert release["replicated_layout"] and series["replicated_layout"]
            if release["offloaded_groups"] == 1:
                for k in ("host_bytes_per_token", "tokens_per_gib"):
                    assert series[k] == release[k], (arch, tp, k)
            else:
                assert series["tokens_per_gib"] > release["tokens_per_gib"]


def test_034_unproven_replication_is_unchanged(rows):
    # Where the 0.34.0 series shares nothing (every layer's copy is a
    # rank's own) in a model of one group, its host layout is 0.34.0's row.
    for key, row in rows.items():
        series, release = row[SERIES_034], row[RELEASE]
        classes = series["layer_classes"]
        if len(classes) == 1 and classes[0]["copies"] == key[1]:
            assert series["kv_tp_replicas"] == 1
            if series["offloaded_groups"] == 1:
                for k in ("host_copies", "host_bytes_per_token", "tokens_per_gib"):
                    assert series[k] == release[k], (key, k)


def test_034_series_canonical_layout_agrees_on_both_sides(rows):
    # The release's scheduler and workers may size the canonical layout
    # differently; with the series they never do.
    for key, row in rows.items():
        assert row[SERIES_034]["canonical"]["agree"], key
    assert any(not row[RELEASE]["canonical"]["agree"] for row in rows.values())


def _state_bytes(model_dir: str, tp: int) -> int:
    """One rank's linear-attention state of a hybrid, counted from its
    published config (bench/models) by the model's math, independently of
    vLLM's code: the convolution's last kernel - 1 inputs of the rank's
    channels (bf16) and the recurrent state of its heads (bf16 for gated
    DeltaNet, float32 for Mamba2 and KDA, as vLLM keeps them on a GPU)."""
    config = demo.architectures.published_config(model_dir)
    if model_dir == "qwen3-next-like":
        dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
        hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
        conv = (2 * hk * dk + hv * dv) // tp * (config["linear_conv_kernel_dim"] - 1)
        return 2 * conv + 2 * (hv // tp) * dk * dv
    if model_dir == "nemotron-nano-like":
        heads, dim = config["mamba_num_heads"], config["mamba_head_dim"]
        state = config["ssm_state_size"]
        channels = heads * dim + 2 * config["n_groups"] * state
        conv = channels // tp * (config["conv_kernel"] - 1)
        return 2 * conv + 4 * (heads // tp) * dim * state
    if model_dir == "kimi-linear-like":
        kda = config["linear_attn_config"]
        heads, dim = kda["num_heads"], kda["head_dim"]
        conv = 3 * heads * dim // tp * (kda["short_conv_kernel_size"] - 1)
        return 2 * conv + 4 * (heads // tp) * dim * dim
    raise ValueError(model_dir)


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
    # DeepSeek-V4-like: 43 layers of a compressed latent (512 bf16 dims a
    # state of 4 tokens: 16384 bytes a 64-token block), its indexer (132
    # bytes a state: 2112) and the sliding-window cache (512 bf16 dims a
    # token: 65536), all the same on every rank.
    row = rows[("DeepSeek-V4-like (MLA + indexer + SWA)", 8, 1)]
    assert row["limit_bytes_per_token"] == 43 * (16384 + 2112 + 65536) / 64
    # Hybrids: each state is per rank (TP pieces), each attention layer has
    # its KV heads (or one MLA latent); a chunk of tokens holds a state of
    # every state layer (a block of the tokens vLLM picks) and every
    # attention layer's KV of those tokens.
    for tp in (2, 8):
        row = rows[("Qwen3.5/Qwen3-Next-like (3 GDN : 1 attention, 2 KV heads)", tp, 1)]
        tokens = row[SERIES_034]["tokens_per_chunk"]
        state = 36 * tp * _state_bytes("qwen3-next-like", tp)
        attention = 12 * 2 * (2 * 256 * 2) * tokens
        assert row["limit_bytes_per_token"] == (state + attention) / tokens
        row = rows[("Nemotron-Nano-like (Mamba2 hybrid, 2 KV heads)", tp, 1)]
        tokens = row[SERIES_034]["tokens_per_chunk"]
        state = 27 * tp * _state_bytes("nemotron-nano-like", tp)
        attention = 4 * 2 * (2 * 128 * 2) * tokens
        assert row["limit_bytes_per_token"] == (state + attention) / tokens
    for tp in (8, 16):
        row = rows[("Kimi-Linear-like (3 KDA : 1 MLA)", tp, 1)]
        tokens = row[SERIES_034]["tokens_per_chunk"]
        state = 20 * tp * _state_bytes("kimi-linear-like", tp)
        assert row["limit_bytes_per_token"] == (state + 7 * 1152 * tokens) / tokens
    # The Mamba hybrid's state: 3 x 10240 bf16 inputs and 128 heads of
    # 64 x 128 float32 state, sharded by TP; 12 MLA layers.
    row = rows[("MLA + Mamba hybrid", 8, 1)]
    state = 36 * 8 * (2 * 3 * 10240 // 8 + 4 * 128 // 8 * 64 * 128)
    assert row["limit_bytes_per_token"] == (state + 12 * 1152 * 64) / 64


def test_canonical_column_is_what_each_release_decides_on_each_side(rows):
    # 0.34.0's canonical layout on a target with a draft at TP 8: its
    # scheduler sees one spec per group (MLA) and keeps one host copy, its
    # workers eight; with the series both sides keep eight.
    row = rows[("DeepSeek-V3 + EAGLE-3 draft (8 KV heads)", 8, 1)]
    release = row[RELEASE]["canonical"]
    assert (release["worker"]["host_copies"], release["scheduler"]["host_copies"]) == (
        8,
        1,
    )
    assert not release["agree"]
    series = row[SERIES_034]["canonical"]
    assert series["agree"] and series["worker"]["host_copies"] == 8
    # Where every layer is MLA, the canonical layout keeps one copy on both.
    for tree in (RELEASE, SERIES_034):
        canonical = rows[("DeepSeek-V3 (MLA)", 8, 1)][tree]["canonical"]
        assert canonical["agree"] and canonical["worker"]["host_copies"] == 1


def test_store_traffic_is_one_page_per_copy(rows):
    # With the 0.34.0 series every copy of every layer is written once per
    # chunk, each distinct piece of KV once, so the ranks together write the
    # limit; the ranks holding a copy take turns, so every rank writes its
    # share.
    for key, row in rows.items():
        series = row[SERIES_034]
        assert series["store_bytes_per_token"] == pytest.approx(
            row["limit_bytes_per_token"], rel=1e-9
        ), key
        assert series["busiest_rank_store_bytes_per_token"] * key[1] == (
            pytest.approx(series["store_bytes_per_token"])
        ), key
        # The other trees have no host layout to read it from.
        for tree in demo.LABELS[:-1]:
            assert "store_bytes_per_token" not in row[tree], (key, tree)


def test_the_chart_shows_the_summary(every_row, tmp_path):
    from PIL import Image

    path = tmp_path / "summary.png"
    demo.plot_summary(list(every_row.values()), path)
    drawn = json.loads(Image.open(path).info["Description"])
    summary = demo.summary_rows(list(every_row.values()))
    # TP 16 on two hosts of 8, as people run it.
    assert {(r["tp"], r["hosts"]) for r in summary} >= {(8, 1), (16, 2)}
    for row in summary:
        numbers = drawn[row["arch"]]
        assert numbers["vLLM 0.34.0"] == row[RELEASE]["tokens_per_gib"]
        assert numbers["0.34.0 + series"] == row[SERIES_034]["tokens_per_gib"]
    # The README's chart is this one (regenerate it with
    # `make demo ARGS="--plot docs/demo-summary.png"`).
    readme_chart = json.loads(
        Image.open(ROOT / "docs" / "demo-summary.png").info["Description"]
    )
    assert readme_chart == drawn


def test_layer_classes_need_what_each_layer_splits_into(rows, every_row):
    """Per class of layers (equal replica groups, laid out per layer by the
    0.34.0 series' host layout), the host copies the class keeps are the
    distinct pieces each of its layers splits into by the model's math,
    every layer counted once; the page-weighted average lies between the
    fewest and the most. Only the mixes have more than one class, and the
    release lays out none."""
    archs = {a.name: a for a in demo.architectures.ARCHITECTURES}
    mixed = set()
    for (name, tp, dcp), row in rows.items():
        arch, series = archs[name], row[SERIES_034]
        assert row[RELEASE]["layer_classes"] is None
        counted: dict[str, int] = {}
        for layer_class in series["layer_classes"]:
            groups = layer_class["replica_groups"]
            assert len(groups) == tp and len(set(groups)) == layer_class["copies"]
            for what, count in layer_class["layers"].items():
                kind = what.split()[0]
                pieces = demo.architectures.distinct_shards(kind, arch, tp, dcp)
                assert layer_class["copies"] == pieces, (name, tp, dcp, what)
                counted[kind] = counted.get(kind, 0) + count
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
        demo.print_summary(list(every_row.values()))
    classes = text.getvalue().split("a chunk of every group takes:\n")[1]
    assert [line.split(", TP ")[0].strip() for line in classes.splitlines()] == [
        a.name for a in demo.architectures.ARCHITECTURES if a.name in mixed
    ]
    assert (
        "  DeepSeek-V3 + EAGLE-3 draft (8 KV heads), TP 8: 1 for 61 mla layers, "
        "8 for 1 draft layer" in classes.splitlines()
    )


def test_every_multi_host_row_of_the_series_is_within_1_01_of_the_per_host_limit(
    host_rows,
):
    """On several hosts (TP 16 as 2 x 8 and 4 x 4, every DCP size), the
    0.34.0 series keeps one copy per replica group on each host: at most
    1.01 times the limit counted per host (every distinct piece once on each
    host that holds a part of it), and no tree below it. Every failing row
    is named with its numbers."""
    assert {k[3] for k in host_rows} == {2, 4}
    failures = []
    for (arch, tp, dcp, hosts), row in sorted(host_rows.items()):
        limit = row["limit_bytes_per_token"]
        for tree in demo.LABELS:
            got = row[tree]["host_bytes_per_token"]
            if got < 0.999 * row[tree]["limit_bytes_per_token"] or (
                tree == SERIES_034 and got > 1.01 * limit
            ):
                failures.append(
                    f"{arch}, TP {tp}, DCP {dcp}, {hosts} hosts, {tree}: "
                    f"{got:.1f} host bytes per token, {got / limit:.4f} times "
                    f"the per-host limit {limit:.1f}"
                )
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "arch, hosts, copies",
    [
        # One copy on each host, where 0.34.0 keeps one per rank.
        ("DeepSeek-V3 (MLA)", 2, 2),
        ("DeepSeek-V3 (MLA)", 4, 4),
        ("DeepSeek-V3.2 (MLA + indexer)", 2, 2),
        # 8 KV heads at TP 16: runs of 2 ranks hold one, 4 on each host of 8.
        ("Llama-3.1-405B-like (GQA, 8 KV heads)", 2, 8),
        ("GLM-4.5-like (GQA, 8 KV heads)", 4, 8),
    ],
)
def test_tp16_on_several_hosts_keeps_a_copy_per_replica_group_on_each(
    host_rows, all_rows, arch, hosts, copies
):
    """What users of two 8-GPU hosts (or four 4-GPU trays) gain: the releases
    and the 0.30.0 trees keep a copy per rank; the 0.34.0 series one per
    replica group on each host, and the single-host row is unchanged."""
    row = host_rows[(arch, 16, 1, hosts)]
    for tree in (*TREES, RELEASE):
        assert row[tree]["host_copies"] == 16, tree
        assert not row[tree]["replicated_layout"], tree
    series = row[SERIES_034]
    assert series["host_copies"] == copies
    release = row[RELEASE]["host_bytes_per_token"]
    assert release / series["host_bytes_per_token"] == pytest.approx(
        16 / copies, rel=0.01
    )
    one_host = all_rows[(arch, 16, 1)]
    assert one_host["hosts"] == 1
    assert one_host[SERIES_034]["host_copies"] <= copies


def test_every_pipeline_row_of_the_series_is_within_1_01_of_the_per_host_limit(
    pp_rows,
):
    """TP 8 x PP 2 on one host of 16 and on two of 8 (every DCP size): each
    stage keeps its own layers, one copy per replica group of its workers on
    each host, in units of its own, at most 1.01 times the limit counted per
    host (hybrids whose state groups fall unevenly on the stages among
    them), never more than 0.34.0 keeps, and no tree below the limit. Every
    failing row is named with its numbers."""
    assert {k[3:] for k in pp_rows} == {(1, 2), (2, 2)}
    failures = []
    for (arch, tp, dcp, hosts, pp), row in sorted(pp_rows.items()):
        limit = row["limit_bytes_per_token"]
        for tree in demo.LABELS:
            got = row[tree]["host_bytes_per_token"]
            if got < 0.999 * row[tree]["limit_bytes_per_token"] or (
                tree == SERIES_034
                and (got > 1.01 * limit or got > row[RELEASE]["host_bytes_per_token"])
            ):
                failures.append(
                    f"{arch}, TP {tp} x PP {pp}, DCP {dcp}, {hosts} hosts, {tree}: "
                    f"{got:.1f} host bytes per token, {got / limit:.4f} times "
                    f"the per-host limit {limit:.1f}"
                )
    assert not failures, "\n".join(failures)


def test_pipeline_stages_keep_regions_of_their_own(pp_rows, all_rows):
    """What users of TP 8 x PP 2 gain: 0.34.0 sizes rows of a block per rank
    of all 16 (each stage's ranks fill 8 of them with their own layers), and
    where its stages' blocks differ in bytes on one host (DeepSeek-V3's 61
    layers split 31/30), they lay out one region differently: unsafe; or (a
    draft on the last stage) the last stage has fewer rows than the
    scheduler hands out, on its own host too. The series keeps one copy of
    each MLA layer, on its stage's host, as TP 8 on one host does, and its
    stages always agree."""
    for key, row in pp_rows.items():
        assert row[SERIES_034]["stages_agree"], key
        assert row[RELEASE]["host_copies"] == 16, key
    for hosts in (1, 2):
        row = pp_rows[("DeepSeek-V3 (MLA)", 8, 1, hosts, 2)]
        assert row[SERIES_034]["host_copies"] == 1
        assert (
            row[SERIES_034]["tokens_per_gib"]
            == (all_rows[("DeepSeek-V3 (MLA)", 8, 1)][SERIES_034]["tokens_per_gib"])
        )
        # 16 blocks of the first stage's 31 layers, against each of 61 once.
        assert row[RELEASE]["host_bytes_per_token"] == pytest.approx(
            16 * 31 / 61 * row[SERIES_034]["host_bytes_per_token"], rel=0.01
        )
    assert not pp_rows[("DeepSeek-V3 (MLA)", 8, 1, 1, 2)][RELEASE]["stages_agree"]
    assert pp_rows[("DeepSeek-V3 (MLA)", 8, 1, 2, 2)][RELEASE]["stages_agree"]
    draft = "Qwen3-235B-like + EAGLE-3 draft (8 KV heads)"
    assert not pp_rows[(draft, 8, 1, 2, 2)][RELEASE]["stages_agree"]
    # Equal stages (31 + 30 layers and the MTP layer) agree in 0.34.0.
    assert pp_rows[("DeepSeek-V3 + MTP draft", 8, 1, 1, 2)][RELEASE]["stages_agree"]


def test_under_ray_the_series_shares_as_under_mp_and_the_release_does_not(
    every_row,
):
    """Each model in its usual deployment under the Ray executor: the series
    reserves exactly what it reserves under mp (Ray records each worker's
    node); 0.34.0 keeps a copy per worker there, TP times its own mp
    single copy for the MLA-only models, and its mp rows elsewhere."""
    usual = [r for r in demo.summary_rows(list(every_row.values())) if demo._ok(r)]
    assert {r["arch"] for r in usual} == {
        a.name for a in demo.architectures.ARCHITECTURES
    }
    for row in usual:
        key = (row["arch"], row["tp"], row["hosts"])
        series, release = row[SERIES_034], row[RELEASE]
        for k in ("tokens_per_gib", "host_bytes_per_token"):
            assert series["ray"][k] == series[k], (key, k)
        assert not release["ray"]["replicated_layout"], key
        if row["arch"] in MLA_ONLY and row["hosts"] == 1:
            assert release["replicated_layout"], key
            # TP copies (within the page rounding of the one-copy row).
            assert release["ray"]["host_bytes_per_token"] == pytest.approx(
                row["tp"] * release["host_bytes_per_token"], rel=0.01
            ), key
        elif not release["replicated_layout"]:
            assert release["ray"] == {k: release[k] for k in release["ray"]}, key
        assert series["ray"]["tokens_per_gib"] >= release["ray"]["tokens_per_gib"]
    # The Ray rows are what users on Ray gain: several times more for MLA.
    gains = {
        r["arch"]: r[SERIES_034]["ray"]["tokens_per_gib"]
        / r[RELEASE]["ray"]["tokens_per_gib"]
        for r in usual
    }
    assert gains["DeepSeek-V3 (MLA)"] >= 8
