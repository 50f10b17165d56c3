"""The main job's numbers, from the three trees' real code (bench/demo.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ("base", "seed", "series")


@pytest.fixture(scope="module")
def rows():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "demo.py"), "--json"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    rows = {(r["arch"], r["tp"], r["dcp"]): r for r in json.loads(out)}
    return {k: r for k, r in rows.items() if "unsupported" not in r["series"]}


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
        for tree in TREES:
            assert (
                row[tree]["host_bytes_per_token"]
                >= 0.999 * row["limit_bytes_per_token"]
            ), (key, tree)


def test_at_the_limit_where_every_layer_replicates_alike(rows):
    uniform = ("DeepSeek", "Llama", "Qwen3-235B", "Qwen2.5")
    for (arch, tp, dcp), row in rows.items():
        if arch.startswith(uniform) and dcp == 1:
            assert row["series"]["host_bytes_per_token"] == pytest.approx(
                row["limit_bytes_per_token"], rel=0.01
            ), (arch, tp)


def test_unproven_replication_is_unchanged(rows):
    for key, row in rows.items():
        for tree in ("seed", "series"):
            if row[tree]["kv_tp_replicas"] == 1:
                assert row[tree] == {**row["base"], "kv_tp_replicas": 1}, (key, tree)


def test_base_tree_has_no_replica_count(rows):
    assert all(r["base"].get("kv_tp_replicas") is None for r in rows.values())
