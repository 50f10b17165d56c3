"""The series changes what is claimed about replication, nothing else: random
KV cache layer mixes plan exactly as in the unpatched base (the same groups,
layers, specs, tensors and num_blocks, or the same error), whatever the
layers declare, and the series' replication claims are what each layer's own
declaration proves: kv_tp_replicas, and the replica plan (0.30.0: the
whole model's kv_tp_replica_groups; 0.34.0: every layer's
layer_tp_replica_groups).

For each base: the unpatched release plans the layers as its users get them
today (declaring only what the release's own layers declare: nothing in
0.30.0, max_tp_shards=1 on MLA in 0.34.0), the series plans them with
random declarations (mixed, missing, inconsistent, uneven)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import ws

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "planning_worker.py"
# Per base, to keep the runtime of both within a few minutes on two cores.
NUM_MIXES = {"0.30.0": 1000, "0.34.0": 600}

sys.path.insert(0, str(WORKER.parent))
import planning_worker  # noqa: E402


def _plan(
    workspace: ws.Workspace, tree: Path, out: Path, release: bool
) -> subprocess.Popen:
    env = {**workspace.test_environ(), "PYTHONPATH": str(tree)}
    base = workspace.base
    args = [str(out), str(NUM_MIXES[base]), str(planning_worker.SEED)]
    args += ["--base", base] + (["--release"] if release else [])
    return subprocess.Popen(
        [workspace.python, str(WORKER), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _expected_replicas(mix: dict) -> int:
    """kv_tp_replicas from each layer's declaration, by the rule written out
    independently: a declared attention layer whose shards divide TP has
    tp // shards replicas, except under DCP (its layers are DCP-sharded); a
    Mamba state that every rank holds in full (tp_replicated) has tp;
    anything else has 1."""
    tp, replicas = mix["tp"], 0
    for layer in mix["layers"]:
        if layer["kind"] == "mamba":
            layer_replicas = tp if layer.get("tp_replicated") else 1
        else:
            shards = layer.get("declare")
            ok = shards is not None and mix["dcp"] == 1 and tp % shards == 0
            layer_replicas = tp // shards if ok else 1
        replicas = math.gcd(replicas, layer_replicas)
    return replicas or 1


def _release_replicas(base: str, mix: dict) -> int | None:
    """The unpatched release's own kv_tp_replicas for its declarations (see
    planning_worker.RELEASE_DECLARATIONS): 0.30.0 has none; 0.34.0 counts
    MLA (max_tp_shards=1: tp replicas, 1 under DCP) and nothing else (not
    even tp_replicated Mamba state)."""
    if base == "0.30.0":
        return None
    replicas = 0
    for layer in mix["layers"]:
        mla = layer["kind"] == "mla" and mix["dcp"] == 1
        replicas = math.gcd(replicas, mix["tp"] if mla else 1)
    return replicas or 1


def _expected_groups(
    mix: dict, layers: list[dict] | None = None, claimed_only: bool = True
) -> list[int]:
    """The replica groups from what each rank holds of each of ``layers``
    (default: the mix's): a declared attention layer whose shards divide TP,
    its head shard and, under DCP, its DCP rank (tp_rank % dcp); a Mamba
    state every rank holds in full (tp_replicated), the same on every rank;
    anything else, something of its own. With ``claimed_only`` (the 0.30.0
    series' field), empty when no two ranks hold the same."""
    tp, dcp = mix["tp"], mix["dcp"]
    held: list[list] = [[] for _ in range(tp)]
    for layer in mix["layers"] if layers is None else layers:
        shards = layer.get("declare")
        for rank in range(tp):
            if layer["kind"] == "mamba" and layer.get("tp_replicated"):
                held[rank].append("all")
            elif shards is not None and tp % shards == 0:
                held[rank].append((rank // (tp // shards), rank % dcp))
            else:
                held[rank].append(("own", rank))
    ids: dict[tuple, int] = {}
    groups = [ids.setdefault(tuple(h), len(ids)) for h in held]
    return [] if claimed_only and len(ids) == tp else groups


def _expected_layer_groups(mix: dict) -> dict[str, list[int]]:
    """Each layer's own replica groups (the 0.34.0 series' plan)."""
    return {
        layer["name"]: _expected_groups(mix, [layer], claimed_only=False)
        for layer in mix["layers"]
    }


@pytest.mark.parametrize("base", sorted(NUM_MIXES))
def test_random_layer_mixes_plan_as_in_the_base(tmp_path, base):
    workspace = ws.Workspace(ROOT, base)
    num_mixes = NUM_MIXES[base]
    procs = {
        "base": _plan(
            workspace, workspace.base_tree(), tmp_path / "base.json", release=True
        ),
        "series": _plan(
            workspace, workspace.tree, tmp_path / "series.json", release=False
        ),
    }
    results = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{name} worker failed:\n{err[-4000:]}"
        results[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert Path(results["base"]["vllm"]) == workspace.base_tree() / "vllm"
    assert Path(results["series"]["vllm"]) == workspace.tree / "vllm"
    base_results = results["base"]["results"]
    series = results["series"]["results"]
    mixes = planning_worker.draw_mixes(planning_worker.SEED, num_mixes, base)
    assert len(base_results) == len(series) == len(mixes) == num_mixes
    for i, (mix, b, s) in enumerate(zip(mixes, base_results, series)):
        # Identical planning, or the identical error.
        assert b.get("plan") == s.get("plan"), f"mix {i} plans differently: {mix}"
        assert b.get("error") == s.get("error"), f"mix {i} fails differently: {mix}"
        release_replicas = _release_replicas(base, mix) if "plan" in b else None
        assert b["kv_tp_replicas"] == release_replicas, f"mix {i}: {mix}"
        assert b["kv_tp_replica_groups"] is None, "the base has no replica groups"
        assert b["layer_tp_replica_groups"] is None, "nor per-layer groups"
        if "plan" in s:
            assert s["kv_tp_replicas"] == _expected_replicas(mix), f"mix {i}: {mix}"
            if base == "0.30.0":  # 0.30.0 takes fixes only
                assert s["kv_tp_replica_groups"] == _expected_groups(mix), f"mix {i}"
            else:
                assert s["layer_tp_replica_groups"] == _expected_layer_groups(mix), (
                    f"mix {i}: {mix}"
                )

    # The comparison covers what it claims: most mixes plan, some of them
    # with replication claimed, and the shapes of the issue are all there.
    planned = [s for s in series if "plan" in s]
    assert len(planned) > 0.8 * num_mixes
    assert sum(s["kv_tp_replicas"] > 1 for s in planned) > 0.05 * num_mixes

    def shared(groups) -> bool:
        return len(set(groups)) < len(groups)

    if base == "0.30.0":
        # ... and some with replica groups that are not runs (DCP).
        assert any(
            s["kv_tp_replica_groups"] and s["kv_tp_replicas"] == 1 for s in planned
        )
    else:
        # ... and some layers with replica groups that are not runs (DCP),
        # and layer classes that share more than the whole model does.
        assert any(
            mix["dcp"] > 1 and any(map(shared, s["layer_tp_replica_groups"].values()))
            for mix, s in zip(mixes, series)
            if "plan" in s
        )
        assert any(
            s["kv_tp_replicas"] == 1
            and any(map(shared, s["layer_tp_replica_groups"].values()))
            for s in planned
        )
    assert any("error" in s for s in series)
    shapes = {mix["shape"] for mix in mixes}
    assert {"mamba-first", "sliding-window-first", "target+draft"} <= shapes
    mixed = [
        mix
        for mix in mixes
        if len({layer.get("declare") for layer in mix["layers"]}) > 1
    ]
    assert len(mixed) > 0.5 * num_mixes
    if base != "0.30.0":
        # TP-replicated Mamba state, alone and next to attention, planned.
        replicated = [
            s
            for mix, s in zip(mixes, series)
            if "plan" in s
            and any(layer.get("tp_replicated") for layer in mix["layers"])
        ]
        assert sum(s["kv_tp_replicas"] > 1 for s in replicated) > 5
        assert sum(s["kv_tp_replicas"] == 1 for s in replicated) > 5
