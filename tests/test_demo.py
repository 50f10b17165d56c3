"""The main job's numbers, from both trees' real code (bench/demo.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rows():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "demo.py"), "--json"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return {(r["arch"], r["tp"], r["dcp"]): r for r in json.loads(out)}


def test_deepseek_v32_tp8_stores_one_host_copy_instead_of_eight(rows):
    row = rows[("DeepSeek-V3.2 (MLA + indexer)", 8, 1)]
    base, this = row["base"], row["patched"]
    assert not base["replicated_layout"] and this["replicated_layout"]
    assert this["kv_tp_replicas"] == 8
    # The base reserves one copy per rank, the series one copy in all (host
    # chunks are rounded up to an alignment, hence not an exact ratio).
    assert base["host_bytes_per_token"] >= 8 * this["worker_bytes_per_token"]
    assert this["host_bytes_per_token"] < 1.01 * this["worker_bytes_per_token"]
    assert this["tokens_per_gib"] >= 8 * base["tokens_per_gib"]


def test_unproven_replication_is_unchanged(rows):
    for (arch, tp, dcp), row in rows.items():
        if "unsupported" in row["patched"]:
            assert "unsupported" in row["base"], (arch, tp, dcp)
            continue
        if arch.startswith(("GQA", "MLA + GQA", "MLA + Mamba")) or dcp > 1 or tp == 1:
            assert row["patched"]["kv_tp_replicas"] == 1, (arch, tp, dcp)
            assert row["patched"] == {**row["base"], "kv_tp_replicas": 1}, (arch, tp)


def test_base_tree_has_no_replica_count(rows):
    assert all(r["base"].get("kv_tp_replicas") is None for r in rows.values())
