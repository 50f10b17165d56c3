"""Plans random KV cache layer mixes with whichever vLLM tree `import vllm`
finds, and writes what get_kv_cache_configs decided to the JSON file named by
its first argument (tests/test_planning_differential.py runs it in the
unpatched base and in the patched tree and compares).

    python tests/planning_worker.py OUT.json [NUM_MIXES] [SEED]
        [--base VERSION] [--release]

--base names the vLLM release the tree is (default 0.30.0): it selects the
planning API to call and the layers the mixes may hold (0.34.0's mixes also
have TP-replicated Mamba state). The mixes are drawn from the seed and the
base alone, so both trees plan the same layers.

Each attention layer also draws a `max_tp_shards` declaration; a tree whose
AttentionSpec has the field gets it. With --release, the layers declare
only what the release's own layers declare (RELEASE_DECLARATIONS: in 0.34.0
MLAAttention declares max_tp_shards=1, GQA nothing), which is what users of
the unpatched release get. For each mix the output holds the plan (groups
with their layers and specs, tensors, num_blocks, every field that takes
part in equality but the replication ones) or the error (type and message),
plus the tree's kv_tp_replicas, kv_tp_replica_groups (the 0.30.0 series) and
layer_tp_replica_groups (the 0.34.0 series), None where the tree has none.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import fields, is_dataclass
from enum import Enum
from fractions import Fraction
from typing import Any

import torch

NUM_MIXES = 300
SEED = 7
TP_SIZES = (1, 2, 4, 8, 16)
KV_HEADS = (1, 2, 4, 8, 16)
BLOCK = 16
# What is claimed about replication, not planning: the declarations (which
# differ between the runs by design; the series leaves max_tp_shards out of
# equality, 0.34.0 compares it) and the replication reported, compared on
# their own.
REPLICATION_FIELDS = ("max_tp_shards", "kv_tp_replicas", "kv_tp_replica_groups")
BASES = ("0.30.0", "0.34.0")
# The max_tp_shards each release's own layers declare, by layer kind.
RELEASE_DECLARATIONS: dict[str, dict[str, int]] = {
    "0.30.0": {},
    "0.34.0": {"mla": 1},  # MLAAttention.get_kv_cache_spec
}


def draw_mixes(seed: int, count: int, base: str = "0.30.0") -> list[dict[str, Any]]:
    """Layer mixes as plain data: shapes seen in real models, in random order
    and with mixed, missing and inconsistent declarations. 0.34.0's mixes
    also have Mamba state that every TP rank holds in full (tp_replicated);
    0.30.0's are drawn as they always were."""
    assert base in BASES, base
    rng = random.Random(seed)
    mixes = []
    for _ in range(count):
        tp = rng.choice(TP_SIZES)
        dcp = rng.choice((1, 1, 1, 2)) if tp > 1 else 1
        shape = rng.choice(
            (
                "random",
                "mamba-first",
                "sliding-window-first",
                "per-layer-kv-heads",
                "target+draft",
                "mla",
                "mla-hybrid",
            )
        )
        kv_heads = rng.choice(KV_HEADS)
        head = rng.choice((64, 128))
        # Some models declare every layer as its math says; the others mix
        # declared and undeclared layers, and values the math does not
        # support (still valid ints).
        consistent = rng.random() < 0.3

        def gqa(kind: str, heads: int = kv_heads, size: int = head) -> dict:
            declare = (
                heads
                if consistent
                else rng.choice((heads, heads, None, 1, 3, 2 * heads))
            )
            return {"kind": kind, "kv_heads": heads, "head": size, "declare": declare}

        def mla() -> dict:
            return {
                "kind": "mla",
                "declare": 1 if consistent else rng.choice((1, None)),
            }

        def mamba() -> dict:
            layer = {"kind": "mamba", "padded": rng.random() < 0.7}
            if base != "0.30.0":
                layer["tp_replicated"] = rng.random() < 0.3
            return layer

        layers: list[tuple[str, dict]] = []
        n = rng.randint(1, 8)
        if shape == "random":
            kinds = ("full", "swa", "chunked", "mla", "mamba")
            for _ in range(n):
                kind = rng.choice(kinds)
                spec = (
                    mla()
                    if kind == "mla"
                    else mamba()
                    if kind == "mamba"
                    else gqa(kind)
                )
                layers.append(("model.layers", spec))
        elif shape == "mamba-first":
            layers.append(("model.layers", mamba()))
            layers += [("model.layers", gqa("full")) for _ in range(n)]
        elif shape == "sliding-window-first":
            layers.append(("model.layers", gqa("swa")))
            layers += [
                ("model.layers", gqa(rng.choice(("full", "swa")))) for _ in range(n)
            ]
        elif shape == "per-layer-kv-heads":
            layers += [
                ("model.layers", gqa("full", heads=rng.choice(KV_HEADS)))
                for _ in range(n)
            ]
        elif shape == "target+draft":
            layers += [
                ("model.layers", gqa(rng.choice(("full", "swa")))) for _ in range(n)
            ]
            draft_heads = rng.choice(KV_HEADS)
            draft_head = rng.choice((head, 64, 128))
            layers += [
                ("draft_model.layers", gqa("full", draft_heads, draft_head))
                for _ in range(rng.randint(1, 2))
            ]
        elif shape == "mla":
            layers += [("model.layers", mla()) for _ in range(n)]
        else:  # mla-hybrid: linear attention / Mamba mixed with MLA
            layers += [("model.layers", rng.choice((mla(), mamba()))) for _ in range(n)]
        named = [
            {"name": f"{prefix}.{i}.attn", **spec}
            for i, (prefix, spec) in enumerate(layers)
        ]
        mixes.append({"tp": tp, "dcp": dcp, "shape": shape, "layers": named})
    return mixes


def build_specs(mix: dict[str, Any], release: dict[str, int] | None) -> dict[str, Any]:
    """The mix's specs, each attention layer with its drawn declaration, or
    with `release`'s (by kind) when given, where the tree has the field."""
    from vllm.v1.kv_cache_interface import (
        AttentionSpec,
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    has_field = any(f.name == "max_tp_shards" for f in fields(AttentionSpec))
    tp = mix["tp"]
    specs: dict[str, Any] = {}
    attention_page = None
    for layer in mix["layers"]:
        kind = layer["kind"]
        shards = layer.get("declare") if release is None else release.get(kind)
        declare = {"max_tp_shards": shards} if has_field and kind != "mamba" else {}
        common = dict(block_size=BLOCK, dtype=torch.bfloat16, **declare)
        if kind in ("full", "swa", "chunked"):
            common.update(
                num_kv_heads=max(1, layer["kv_heads"] // tp), head_size=layer["head"]
            )
        if kind == "full":
            spec = FullAttentionSpec(**common)
        elif kind == "swa":
            spec = SlidingWindowSpec(sliding_window=128, **common)
        elif kind == "chunked":
            spec = ChunkedLocalAttentionSpec(attention_chunk_size=64, **common)
        elif kind == "mla":
            spec = MLAAttentionSpec(num_kv_heads=1, head_size=576, **common)
        else:
            spec = None
        if spec is not None:
            attention_page = attention_page or spec.page_size_bytes
        specs[layer["name"]] = spec
    for layer in mix["layers"]:
        if layer["kind"] == "mamba":
            # Padded to the attention page as the platform does, or not.
            padded = attention_page if layer["padded"] else None
            replicated = (
                {"tp_replicated": layer["tp_replicated"]}
                if "tp_replicated" in layer
                else {}
            )
            specs[layer["name"]] = MambaSpec(
                block_size=BLOCK,
                shapes=((2, 64), (4, 8, 8)),
                dtypes=(torch.bfloat16, torch.float32),
                page_size_padded=padded,
                mamba_cache_mode="none",
                **replicated,
            )
    return specs


def canon(obj: Any) -> Any:
    """A JSON value for a planning result: dataclasses by their fields that
    take part in equality, except the replication ones (max_tp_shards,
    KVCacheConfig.kv_tp_replicas and kv_tp_replica_groups: reported on their
    own)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        out = {"__type__": type(obj).__name__}
        for f in fields(obj):
            if f.compare and f.name not in REPLICATION_FIELDS:
                out[f.name] = canon(getattr(obj, f.name))
        return out
    if isinstance(obj, dict):
        return {str(k): canon(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canon(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(json.dumps(canon(v), sort_keys=True) for v in obj)
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    if isinstance(obj, (Enum, Fraction, torch.dtype)):
        return str(obj)
    return repr(obj)


def error_text(exc: BaseException) -> str:
    # A spec's repr in a message shows max_tp_shards in the series only.
    return re.sub(r"max_tp_shards=[^,)]*(, )?", "", str(exc))


def plan_function(base: str):
    """get_kv_cache_configs(vllm_config, specs, memory) in `base`'s API."""
    if base == "0.30.0":
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

        return get_kv_cache_configs
    # 0.34.0 groups the layers of all workers first, as the engine core does.
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )

    def plan(vllm_config, kv_cache_specs, available_memory):
        groups = get_global_kv_cache_groups(vllm_config, kv_cache_specs)
        return get_kv_cache_configs(
            vllm_config, kv_cache_specs, available_memory, groups
        )

    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("count", type=int, nargs="?", default=NUM_MIXES)
    parser.add_argument("seed", type=int, nargs="?", default=SEED)
    parser.add_argument("--base", choices=BASES, default="0.30.0")
    parser.add_argument("--release", action="store_true")
    args = parser.parse_args()
    release = RELEASE_DECLARATIONS[args.base] if args.release else None

    import vllm
    from vllm.config import ModelConfig, VllmConfig
    from vllm.utils.mem_constants import GiB_bytes

    get_kv_cache_configs = plan_function(args.base)
    model_config = ModelConfig(max_model_len=256)
    results = []
    for mix in draw_mixes(args.seed, args.count, args.base):
        vllm_config = VllmConfig(model_config=model_config)
        vllm_config.cache_config.kv_cache_layout = "LBNHC"
        vllm_config.parallel_config.tensor_parallel_size = mix["tp"]
        vllm_config.parallel_config.decode_context_parallel_size = mix["dcp"]
        tp = mix["tp"]
        try:
            specs = build_specs(mix, release)
            configs = get_kv_cache_configs(vllm_config, [specs] * tp, [GiB_bytes] * tp)
        except Exception as e:  # noqa: BLE001 - the error is the result
            results.append(
                {
                    "error": [type(e).__name__, error_text(e)],
                    "kv_tp_replicas": None,
                    "kv_tp_replica_groups": None,
                    "layer_tp_replica_groups": None,
                }
            )
            continue
        replicas = {getattr(cfg, "kv_tp_replicas", None) for cfg in configs}
        groups = {getattr(cfg, "kv_tp_replica_groups", None) for cfg in configs}
        layer_groups = [
            getattr(cfg, "layer_tp_replica_groups", None) for cfg in configs
        ]
        assert len(replicas) == len(groups) == 1, (replicas, groups)
        assert all(g == layer_groups[0] for g in layer_groups), layer_groups
        group, per_layer = groups.pop(), layer_groups[0]
        results.append(
            {
                "plan": canon(configs),
                "kv_tp_replicas": replicas.pop(),
                "kv_tp_replica_groups": None if group is None else list(group),
                "layer_tp_replica_groups": None
                if per_layer is None
                else {name: list(g) for name, g in per_layer.items()},
            }
        )
    with open(args.out, "w") as f:
        json.dump({"vllm": vllm.__path__[0], "results": results}, f)


if __name__ == "__main__":
    main()
