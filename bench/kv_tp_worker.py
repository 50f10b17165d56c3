"""Runs inside one vLLM tree (whichever `import vllm` finds) and writes, as
JSON, to the file named by its argument, what that tree's own code decides for each architecture of
bench/architectures.py: kv_tp_replicas, whether offloading takes the
replicated layout, and the host bytes the CPU offloading spec reserves.

Nothing here decides replication itself:
- each layer's KV cache spec comes from the layer class's own
  get_kv_cache_spec (called on a stand-in for the layer's attributes), so the
  base tree yields specs without max_tp_shards and the patched tree yields
  whatever its layers declare;
- the KV cache config comes from get_kv_cache_configs, for every TP rank;
- the layout from build_offloading_config, and the sizes (host copies
  included) from a real CPUOffloadingSpec with 1 GiB of `cpu_bytes_to_use`.
The CPU offloading spec only dedups through its shared host region, which it
enables on CUDA hosts (0.30.0: is_cuda_alike(); 0.33.0: also XPU, not ROCm);
this machine has none, so the worker models a CUDA host by reporting that
region as available.

It runs in vLLM 0.30.0 and 0.33.0 trees, with or without our series: where
they differ it takes whatever the tree has (see _kv_cache_configs), and the
layer stand-ins carry the attributes either tree's layer classes read.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock, patch

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import architectures  # noqa: E402

GiB = 1 << 30
MAX_MODEL_LEN = 8192

# The combinations vLLM rejects by design: the exception type and its message
# (first line, in full), with where vLLM raises it (0.30.0 and 0.33.0 reject
# the same combinations with the same messages). Any other exception
# is a failure of the demo or of its environment (say, a pydantic
# ValidationError from a ModelConfig that finds no model config) and stops it.
REJECTED_BY_DESIGN = (
    # SlidingWindowSpec.max_memory_usage_bytes (vllm/v1/kv_cache_interface.py;
    # 0.33.0: line 947, for specs with dcp_sharded, the default): DCP does not
    # support sliding-window attention (DeepSeek-V4's SWA cache).
    (AssertionError, r"DCP not support sliding window\."),
    # build_offloading_config
    # (vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py;
    # 0.33.0: line 114):
    # every group's offloaded block must be a multiple of the hash block; with
    # DCP a Mamba hybrid's attention blocks span dcp times the tokens of its
    # Mamba blocks, which then fall short of a hash block.
    (
        AssertionError,
        r"tokens_per_block=\d+ not divisible by tokens_per_hash=\d+\. "
        r"Hybrid models \(e\.g\. Mamba\+Attention\) need "
        r"--enable-prefix-caching to align block sizes\.",
    ),
)


def _layer_specs(
    arch: architectures.Arch, tp: int, hybrid: Any = None
) -> dict[str, Any]:
    """Build one TP rank's layer specs with each layer class's own code (a
    hybrid's with the block sizes its `hybrid` config holds)."""
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
    from vllm.models.deepseek_v4.attention import (
        DeepseekV4Attention,
        DeepseekV4IndexerCache,
    )
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from vllm.v1.kv_cache_interface import MambaSpec

    block = arch.block_size if hybrid is None else hybrid.cache_config.block_size
    config = SimpleNamespace(
        cache_config=SimpleNamespace(
            block_size=block,
            cache_dtype=arch.cache_dtype,
            skip_page_size_padded=None,
        ),
        model_config=SimpleNamespace(dtype=torch.bfloat16),
    )
    cache_config = SimpleNamespace(block_size=block, cache_dtype=arch.cache_dtype)
    gqa = {
        kind: _gqa_attention(arch, tp, kind, block)
        for kind in ("gqa", "draft")
        if kind in arch.layers
    }
    specs: dict[str, Any] = {}
    for i, kind in enumerate(arch.layers):
        name = f"model.layers.{i}"
        if kind == "mla":
            layer = SimpleNamespace(
                kv_cache_dtype=arch.cache_dtype,
                head_size=576,
                indexer=None,
                non_causal_multi_token_decode=False,
                sliding_window=None,
                # No sparse top-k buffer (read only by trees that declare it).
                topk_buffer_width=None,
            )
            specs[f"{name}.attn"] = MLAAttention.get_kv_cache_spec(layer, config)
        elif kind == "dsv32":
            layer = SimpleNamespace(
                kv_cache_dtype="fp8_ds_mla",
                head_size=576,
                indexer=object(),
                non_causal_multi_token_decode=False,
                sliding_window=None,
                # DeepSeek-V3.2's index_topk, the width of the top-k buffer
                # (read only by trees that declare it).
                topk_buffer_width=2048,
            )
            specs[f"{name}.attn"] = MLAAttention.get_kv_cache_spec(layer, config)
            indexer = SimpleNamespace(
                cache_config=cache_config, head_dim=132, dtype=torch.uint8
            )
            specs[f"{name}.indexer"] = DeepseekV32IndexerCache.get_kv_cache_spec(
                indexer, config
            )
        elif kind == "dsv4":
            attn = SimpleNamespace(
                compress_ratio=4,
                kv_cache_dtype=arch.cache_dtype,
                head_dim=512,
                kv_cache_torch_dtype=torch.bfloat16,
            )
            specs[f"{name}.attn"] = DeepseekV4Attention.get_kv_cache_spec(attn, config)
            indexer = SimpleNamespace(
                cache_config=cache_config,
                head_dim=132,
                dtype=torch.uint8,
                compress_ratio=4,
            )
            specs[f"{name}.indexer"] = DeepseekV4IndexerCache.get_kv_cache_spec(
                indexer, config
            )
            swa = SimpleNamespace(
                block_size=block,
                head_dim=512,
                dtype=torch.bfloat16,
                window_size=128,
                cache_config=cache_config,
                packed_bytes_per_token=584,
                packed_page_alignment=576,
                # As DeepseekV4Attention constructs its SWA cache (each read
                # only by trees whose DeepseekV4SWACache takes the argument).
                max_tp_shards=1,
                packed_block_stride_alignment=None,
                bounded_replay=False,
            )
            specs[f"{name}.swa"] = DeepseekV4SWACache.get_kv_cache_spec(swa, config)
        elif kind in gqa:
            specs[f"{name}.attn"] = gqa[kind].get_kv_cache_spec(config)
        elif kind == "linear":
            specs[f"{name}.mixer"] = _linear_attention_spec(hybrid)
        elif kind == "mamba":
            # Mamba2 with 128 heads of 64 x 128 state, TP-sharded by head;
            # the tree's MambaSpec defaults stand for what Mamba2 declares
            # (0.33.0: tp_replicated=False, MambaBase's is_kv_cache_tp_replicated).
            specs[f"{name}.mixer"] = MambaSpec(
                block_size=block,
                shapes=((3, 10240 // tp), (128 // tp, 64, 128)),
                dtypes=(torch.bfloat16, torch.float32),
            )
        else:
            raise ValueError(kind)
    return specs


def _gqa_attention(arch: architectures.Arch, tp: int, kind: str, block: int) -> Any:
    """A real Attention layer as TP rank 0 of `tp` builds it, the way Llama
    and Qwen build theirs: num_kv_heads is the rank's share of the layer's KV
    heads, and the (unquantized) QKVParallelLinear that produces them is
    passed on where this tree's Attention takes it."""
    import inspect

    from vllm.config import CacheConfig, VllmConfig
    from vllm.config.vllm import set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.layers.linear import QKVParallelLinear

    kv_heads = arch.kv_heads_of(kind)
    assert kv_heads is not None
    heads = 64
    head_dim = arch.head_dim if kind == "gqa" else 128
    fake_tp_group = SimpleNamespace(world_size=tp, rank_in_group=0)
    # With the model config, as in a model's constructor (0.33.0's CPU
    # attention backend reads its dtype).
    with (
        set_current_vllm_config(VllmConfig(model_config=_model_config())),
        patch.object(parallel_state, "_TP", fake_tp_group),
    ):
        kwargs = {}
        if "kv_proj" in inspect.signature(Attention.__init__).parameters:
            # The projection's input size does not matter for its claim.
            kwargs["kv_proj"] = QKVParallelLinear(
                head_dim, head_dim, heads, kv_heads, prefix=f"{kind}.tp{tp}.qkv"
            )
        return Attention(
            heads // tp,
            head_dim,
            head_dim**-0.5,
            num_kv_heads=max(1, kv_heads // tp),
            cache_config=CacheConfig(cache_dtype=arch.cache_dtype, block_size=block),
            prefix=f"{kind}.tp{tp}.attn",
            **kwargs,
        )


def _linear_attention_spec(hybrid: Any) -> Any:
    """One rank's linear-attention (GDN, Mamba2) state, as the hybrid's model
    class computes its shapes and dtypes, in the block and page vLLM picks."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.kv_cache_interface import MambaSpec

    model_config = hybrid.model_config
    model_cls, _ = ModelRegistry.resolve_model_cls(
        model_config.architecture, model_config=model_config
    )
    cache_config = hybrid.cache_config
    return MambaSpec(
        block_size=cache_config.mamba_block_size or cache_config.block_size,
        shapes=tuple(model_cls.get_mamba_state_shape_from_config(hybrid)),
        dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(hybrid)),
        page_size_padded=cache_config.mamba_page_size_padded,
    )


def _hybrid_config(arch: architectures.Arch, tp: int, dcp: int) -> Any:
    """The VllmConfig of a hybrid from its published config (bench/models),
    with the attention block size and state page that vLLM picks for it on a
    GPU (FlashAttention's kernel blocks), with prefix caching on."""
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    model_config = ModelConfig(
        model=str(Path(architectures.__file__).parent / "models" / arch.model_dir),
        skip_tokenizer_init=True,
        max_model_len=MAX_MODEL_LEN,
    )
    # The GPU host's rules, not this CPU platform's (which, for one, turns
    # prefix caching off for MLA models such as Kimi-Linear).
    with patch.object(current_platform, "check_and_update_config"):
        config = VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(enable_prefix_caching=True),
        )
    config.parallel_config.tensor_parallel_size = tp
    config.parallel_config.decode_context_parallel_size = dcp
    Platform._align_hybrid_block_size(config, FlashAttentionBackend)
    return config


def _offloading_vllm_config(
    arch,
    tp: int,
    dcp: int,
    extra_config: dict[str, Any] | None = None,
    block_size: int | None = None,
) -> Any:
    """The configuration build_offloading_config reads, as upstream's tests
    build it: a real ParallelConfig on a stand-in VllmConfig."""
    from vllm.config import KVTransferConfig, ParallelConfig
    from vllm.platforms import current_platform

    config = MagicMock()
    config.cache_config.block_size = block_size or arch.block_size
    config.cache_config.enable_prefix_caching = True
    config.cache_config.prefix_match_unit = None
    config.cache_config.cache_dtype = "auto"
    config.cache_config.prefix_cache_retention_interval = None
    config.cache_config.kv_cache_layout = None
    config.model_config.model = arch.name
    config.model_config.dtype = torch.bfloat16
    # Read by trees whose OffloadingModelConfig carries it (0.33.0).
    config.model_config.max_model_len = MAX_MODEL_LEN
    config.model_config.use_mla = arch.use_mla
    config.model_config.get_total_num_kv_heads.return_value = arch.kv_heads or 1
    with patch.object(current_platform, "device_count", return_value=tp):
        config.parallel_config = ParallelConfig(
            tensor_parallel_size=tp,
            decode_context_parallel_size=dcp,
            distributed_executor_backend="mp",
        )
    config.kv_events_config = None
    config.use_v2_model_runner = False
    config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        engine_id="demo",
        kv_connector_extra_config={"cpu_bytes_to_use": GiB, **(extra_config or {})},
    )
    return config


@functools.cache
def _model_config():
    """Only max_model_len matters to the KV cache config; the layer specs
    carry the architecture."""
    from vllm.config import ModelConfig

    return ModelConfig(max_model_len=MAX_MODEL_LEN)


def _kv_cache_configs(vllm_config, specs: list[dict[str, Any]], memory: list[int]):
    """Every worker's KV cache config, planned as this tree's engine core
    plans it: 0.33.0 moved planning to kv_cache_planning, where the engine
    core groups the whole model's layers first and passes the groups in."""
    if importlib.util.find_spec("vllm.v1.core.kv_cache_planning") is None:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

        return get_kv_cache_configs(vllm_config, specs, memory)
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )

    groups = get_global_kv_cache_groups(vllm_config, specs)
    return get_kv_cache_configs(vllm_config, specs, memory, groups)


def _host_copies(spec) -> int:
    """Host copies of each chunk, read off the CPU spec's own sizing: a chunk
    holds one worker page (cpu_page_size_per_worker) per copy, padded up to
    BLOCK_SIZE_ALIGNMENT, which is smaller than a page here, so the padding
    never amounts to another copy."""
    page = spec.cpu_page_size_per_worker
    assert 0 < spec.BLOCK_SIZE_ALIGNMENT <= page, (spec.BLOCK_SIZE_ALIGNMENT, page)
    copies = spec.kv_bytes_per_chunk // page
    # Where the tree names the replica group of each rank (0.30.0 series),
    # it sizes one copy per group.
    groups = getattr(spec, "host_replica_groups", ())
    assert not groups or copies == len(set(groups)), (copies, groups)
    return copies


def _fewest_store_turns(spec, parallel) -> int:
    """The fewest ranks that take turns storing one host copy, over every
    rank, by the tree's own store_turn (0.33.0 series): 1 where one rank of
    each group (or every rank, for its own copy) stores every chunk."""
    if not getattr(spec, "rotates_store_writers", False):
        return 1
    from vllm.v1.kv_offload.config import store_turn

    groups = spec.host_replica_groups
    return min(
        store_turn(dataclasses.replace(parallel, rank=rank), groups)[0]
        for rank in range(parallel.world_size)
    )


def _layer_copies_traffic(
    layer_copies, parallel, tokens_per_block: int
) -> tuple[float, float, float]:
    """Where each layer keeps its own copies (the 0.33.0 series'
    layer_copies): the copies weighted by each layer's page, and the
    device-to-host bytes per offloaded token of all ranks together (every
    copy of every layer written once) and of the busiest rank, which writes
    the chunks of its turn (store_turn) of each layer's copy."""
    from vllm.v1.kv_offload.config import store_turn

    pages = sum(layer.page_size_bytes for layer in layer_copies)
    held = sum(layer.num_copies * layer.page_size_bytes for layer in layer_copies)
    busiest = max(
        sum(
            layer.page_size_bytes
            / store_turn(
                dataclasses.replace(parallel, rank=rank), layer.replica_groups
            )[0]
            for layer in layer_copies
        )
        for rank in range(parallel.world_size)
    )
    return (
        round(held / pages, 2),
        held / tokens_per_block,
        busiest / tokens_per_block,
    )


def _group_copies_traffic(
    group_copies, parallel, worker_bytes_per_token: float
) -> tuple[float, float, float]:
    """Where each KV cache group of a hybrid keeps its own copies (the 0.33.0
    series' group_copies), a chunk of each group being one host unit per
    replica group of that group: the mean copies of a chunk over the groups
    (the demo counts a chunk of every group per chunk of tokens), and the
    device-to-host bytes per offloaded token of all ranks together (every
    unit written once) and of the busiest rank, which writes the units of
    its turn (store_turn) in each group."""
    from vllm.v1.kv_offload.config import store_turn

    copies = [len(set(groups)) for groups in group_copies]
    busiest = max(
        sum(
            1 / store_turn(dataclasses.replace(parallel, rank=rank), groups)[0]
            for groups in group_copies
        )
        for rank in range(parallel.world_size)
    )
    mean = sum(copies) / len(copies)
    return (
        mean,
        mean * worker_bytes_per_token,
        busiest / len(copies) * worker_bytes_per_token,
    )


def measure(arch: architectures.Arch, tp: int, dcp: int) -> dict[str, Any]:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    if arch.model_dir is None:
        vllm_config = VllmConfig(model_config=_model_config())
        vllm_config.parallel_config.tensor_parallel_size = tp
        vllm_config.parallel_config.decode_context_parallel_size = dcp
        vllm_config.cache_config.block_size = arch.block_size
        specs = _layer_specs(arch, tp)
    else:
        vllm_config = _hybrid_config(arch, tp, dcp)
        specs = _layer_specs(arch, tp, vllm_config)
    block_size = vllm_config.cache_config.block_size
    # Block-outermost, as the engine core resolves it for these hybrid
    # models; it lets mixed page sizes pack into one block.
    vllm_config.cache_config.kv_cache_layout = "BLNHC"
    configs = _kv_cache_configs(vllm_config, [specs] * tp, [64 * GiB] * tp)
    kv_cache_config = configs[0]

    offloading = build_offloading_config(
        _offloading_vllm_config(arch, tp, dcp, block_size=block_size), kv_cache_config
    )
    with patch.object(CPUOffloadingSpec, "_uses_shared_region", return_value=True):
        spec = CPUOffloadingSpec(offloading)
    tokens_per_block = {g.tokens_per_block for g in offloading.groups}
    tokens_per_chunk = min(tokens_per_block) * offloading.cache.blocks_per_chunk
    worker_bytes_per_token = offloading.worker_kv_bytes_per_block / min(
        tokens_per_block
    )
    # The replica group of each TP rank, where the tree plans one.
    groups = tuple(getattr(kv_cache_config, "kv_tp_replica_groups", ()))
    layer_copies = getattr(spec, "layer_copies", ())
    group_copies = getattr(spec, "group_copies", ())
    # Chunks of tokens the host holds, and its bytes per token: a chunk row
    # each, or, where each group keeps its own copies, a chunk of every
    # group in as many host units as it keeps copies.
    chunks_of_tokens = spec.num_chunks
    host_bytes_per_chunk = spec.kv_bytes_per_chunk
    if group_copies:
        units, store, busiest = _group_copies_traffic(
            group_copies, offloading.parallel, worker_bytes_per_token
        )
        copies = round(units, 2)
        chunks_of_tokens = int(spec.num_chunks / units)
        host_bytes_per_chunk = spec.kv_bytes_per_chunk * units
    elif layer_copies:
        copies, store, busiest = _layer_copies_traffic(
            layer_copies, offloading.parallel, min(tokens_per_block)
        )
    else:
        copies = _host_copies(spec)
        # Every copy is written once, one rank's page each. The busiest rank
        # writes one rank's bytes where one rank of each group stores every
        # chunk, its turn's share where the group's ranks take turns.
        store = copies * worker_bytes_per_token
        busiest = worker_bytes_per_token / _fewest_store_turns(
            spec, offloading.parallel
        )
    return {
        "kv_tp_replicas": getattr(kv_cache_config, "kv_tp_replicas", None),
        "kv_tp_replica_groups": list(groups) or None,
        "replicated_layout": spec.replicated_layout,
        # Host copies of each chunk the CPU spec keeps: one per replica group
        # it shares, one in all for the replicated layout, else one per rank;
        # weighted by each layer's page where each layer keeps its own.
        "host_copies": copies,
        # Whether each layer keeps its own copies (0.33.0 series).
        "layer_copies": bool(layer_copies),
        # Whether each KV cache group of a hybrid keeps its own (0.33.0
        # series).
        "group_copies": bool(group_copies),
        # Device-to-host bytes per offloaded token, by all ranks together and
        # by the busiest rank.
        "store_bytes_per_token": store,
        "busiest_rank_store_bytes_per_token": busiest,
        "canonical": _canonical_layout(
            arch, tp, dcp, configs, tokens_per_chunk, block_size
        ),
        "worker_bytes_per_token": worker_bytes_per_token,
        # The physical limit: every distinct piece of KV stored once.
        "limit_bytes_per_token": worker_bytes_per_token
        * _distinct_copies(arch, kv_cache_config, offloading, tp, dcp),
        "host_bytes_per_token": host_bytes_per_chunk / tokens_per_chunk,
        "tokens_per_gib": chunks_of_tokens * tokens_per_chunk,
        "layer_classes": _layer_classes(arch, kv_cache_config, tp),
    }


def _layer_classes(arch: architectures.Arch, kv_cache_config, tp: int):
    """The host copies each class of layers (those with equal replica
    groups) would need on its own, from the groups the tree plans for each
    layer on its own (KVCacheConfig.layer_tp_replica_groups, the 0.33.0
    series; None where the tree plans none): per class, its copies and its
    layers by kind (and cache, where a layer has several), in the order of
    their first layer."""
    planned = getattr(kv_cache_config, "layer_tp_replica_groups", None)
    if planned is None:
        return None
    classes: dict[tuple[int, ...], dict[str, int]] = {}
    for group in kv_cache_config.kv_cache_groups:
        for name in group.layer_names:
            _, _, index, cache = name.split(".")
            kind = arch.layers[int(index)]
            what = kind if cache in ("attn", "mixer") else f"{kind} {cache}"
            layers = classes.setdefault(tuple(planned.get(name, range(tp))), {})
            layers[what] = layers.get(what, 0) + 1
    return [
        {"copies": len(set(groups)), "layers": layers}
        for groups, layers in classes.items()
    ]


def _canonical_layout(
    arch, tp: int, dcp: int, configs, tokens_per_chunk: int, block_size: int
):
    """What the tree's canonical CPU layout (TieringOffloadingSpec with
    canonical_layout, upstream's strongest configuration) reserves, decided
    by its own build_offloading_config on a worker's KV cache config and on
    the scheduler's (one spec per group)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    sides = {
        "worker": configs[0],
        "scheduler": generate_scheduler_kv_cache_config(configs),
    }
    out: dict[str, Any] = {}
    for side, kv_cache_config in sides.items():
        config = _offloading_vllm_config(
            arch,
            tp,
            dcp,
            {"spec_name": "TieringOffloadingSpec", "canonical_layout": True},
            block_size,
        )
        offloading = build_offloading_config(config, kv_cache_config)
        spec = TieringOffloadingSpec(offloading)
        out[side] = {
            "replicated_layout": spec.replicated_layout,
            "parallelism_agnostic": offloading.parallel.is_parallelism_agnostic,
            "host_copies": _host_copies(spec),
            "host_bytes_per_token": spec.kv_bytes_per_chunk / tokens_per_chunk,
            "tokens_per_gib": spec.num_chunks * tokens_per_chunk,
        }
    out["agree"] = out["worker"] == out["scheduler"]
    return out


def _distinct_copies(
    arch: architectures.Arch, kv_cache_config, offloading, tp: int, dcp: int
):
    """How many copies of one rank's block the model's distinct KV amounts
    to, per offloaded chunk: for each offloaded KV cache group, its layers'
    distinct pieces (architectures.distinct_shards) weighted by each layer's
    share of the group's pages; averaged over the groups, a chunk of tokens
    being a chunk of every group, each a block of the rank's bytes."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    per_group = []
    for group_config in offloading.groups:
        group = kv_cache_config.kv_cache_groups[group_config.group_id]
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            layers = list(spec.kv_cache_specs.items())
        else:
            layers = [(name, spec) for name in group.layer_names]
        weighted = total = 0
        for name, layer_spec in layers:
            kind = arch.layers[int(name.split(".")[2])]
            pieces = architectures.distinct_shards(kind, arch, tp, dcp)
            weighted += layer_spec.page_size_bytes * pieces
            total += layer_spec.page_size_bytes
        per_group.append(weighted / total)
    return sum(per_group) / len(per_group)


def rejected_by_design(e: Exception) -> str | None:
    """Why vLLM rejects the combination, if `e` is one of REJECTED_BY_DESIGN."""
    message = (str(e).splitlines() or [""])[0]
    for kind, pattern in REJECTED_BY_DESIGN:
        if type(e) is kind and re.fullmatch(pattern, message):
            return f"{kind.__name__}: {message}"
    return None


def main() -> int:
    import argparse

    import vllm

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", action="append")
    parser.add_argument("--tp", action="append", type=int)
    args = parser.parse_args()
    rows = []
    for arch in architectures.ARCHITECTURES:
        for tp in architectures.TP_SIZES:
            for dcp in architectures.DCP_SIZES:
                if tp % dcp or not arch.supports(tp, dcp):
                    continue
                if not architectures.wanted(arch.name, tp, args.model, args.tp):
                    continue
                row: dict[str, Any] = {"arch": arch.name, "tp": tp, "dcp": dcp}
                try:
                    row.update(measure(arch, tp, dcp))
                except Exception as e:
                    reason = rejected_by_design(e)
                    if reason is None:
                        raise
                    row["unsupported"] = reason
                rows.append(row)
    result = {"vllm": str(Path(vllm.__file__).parent.parent), "rows": rows}
    # vLLM logs to stdout, so the result goes to a file.
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
