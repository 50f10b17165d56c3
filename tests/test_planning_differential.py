"""The series changes what is claimed about replication, nothing else: random
KV cache layer mixes plan exactly as in the unpatched base (the same groups,
layers, specs, tensors and num_blocks, or the same error), whatever the
layers declare, and the series' kv_tp_replicas is what each layer's own
declaration proves."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import ws

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "planning_worker.py"
NUM_MIXES = 1000
# planning_worker.py speaks vLLM 0.30.0's planning API.
BASE = "0.30.0"

sys.path.insert(0, str(WORKER.parent))
import planning_worker  # noqa: E402


def _plan(python: Path, tree: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen(
        [python, str(WORKER), str(out), str(NUM_MIXES)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _expected_replicas(mix: dict) -> int:
    """kv_tp_replicas from each layer's declaration, by the rule written out
    independently: a declared attention layer whose shards divide TP, without
    DCP, has tp // shards replicas; anything else has 1."""
    tp, replicas = mix["tp"], 0
    for layer in mix["layers"]:
        shards = layer.get("declare")
        ok = shards is not None and mix["dcp"] == 1 and tp % shards == 0
        replicas = math.gcd(replicas, tp // shards if ok else 1)
    return replicas or 1


def _expected_groups(mix: dict) -> list[int]:
    """The replica groups from what each rank holds of each layer: a declared
    attention layer whose shards divide TP, its head shard and, under DCP,
    its DCP rank (tp_rank % dcp); anything else, something of its own. Empty
    when no two ranks hold the same."""
    tp, dcp = mix["tp"], mix["dcp"]
    held: list[list] = [[] for _ in range(tp)]
    for layer in mix["layers"]:
        shards = layer.get("declare")
        for rank in range(tp):
            if shards is not None and tp % shards == 0:
                held[rank].append((rank // (tp // shards), rank % dcp))
            else:
                held[rank].append(("own", rank))
    ids: dict[tuple, int] = {}
    groups = [ids.setdefault(tuple(h), len(ids)) for h in held]
    return [] if len(ids) == tp else groups


def test_random_layer_mixes_plan_as_in_the_base(tmp_path):
    workspace = ws.Workspace(ROOT, BASE)
    procs = {
        "base": _plan(workspace.python, workspace.base_tree(), tmp_path / "base.json"),
        "series": _plan(workspace.python, workspace.tree, tmp_path / "series.json"),
    }
    results = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{name} worker failed:\n{err[-4000:]}"
        results[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert Path(results["base"]["vllm"]) == workspace.base_tree() / "vllm"
    assert Path(results["series"]["vllm"]) == workspace.tree / "vllm"
    base, series = results["base"]["results"], results["series"]["results"]
    mixes = planning_worker.draw_mixes(planning_worker.SEED, NUM_MIXES)
    assert len(base) == len(series) == len(mixes) == NUM_MIXES

    for i, (mix, b, s) in enumerate(zip(mixes, base, series)):
        # Identical planning, or the identical error.
        assert b.get("plan") == s.get("plan"), f"mix {i} plans differently: {mix}"
        assert b.get("error") == s.get("error"), f"mix {i} fails differently: {mix}"
        assert b["kv_tp_replicas"] is None, "the base has no kv_tp_replicas"
        assert b["kv_tp_replica_groups"] is None, "nor replica groups"
        if "plan" in s:
            assert s["kv_tp_replicas"] == _expected_replicas(mix), f"mix {i}: {mix}"
            assert s["kv_tp_replica_groups"] == _expected_groups(mix), f"mix {i}"

    # The comparison covers what it claims: most mixes plan, some of them
    # with replication claimed, and the shapes of the issue are all there.
    planned = [s for s in series if "plan" in s]
    assert len(planned) > 0.8 * NUM_MIXES
    assert sum(s["kv_tp_replicas"] > 1 for s in planned) > 0.05 * NUM_MIXES
    # ... and some with replica groups that are not runs (DCP).
    assert any(s["kv_tp_replica_groups"] and s["kv_tp_replicas"] == 1 for s in planned)
    assert any("error" in s for s in series)
    shapes = {mix["shape"] for mix in mixes}
    assert {"mamba-first", "sliding-window-first", "target+draft"} <= shapes
    mixed = [
        mix
        for mix in mixes
        if len({layer.get("declare") for layer in mix["layers"]}) > 1
    ]
    assert len(mixed) > 0.5 * NUM_MIXES
