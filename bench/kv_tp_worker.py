"""Runs inside one vLLM tree (whichever `import vllm` finds) and writes, as
JSON, to the file named by its argument, what that tree's own code decides for
each architecture of bench/architectures.py: kv_tp_replicas, whether
offloading takes the replicated layout, and the host bytes the CPU offloading
spec reserves.

Nothing here decides replication itself:
- each layer's KV cache spec comes from the layer class's own
  get_kv_cache_spec (called on a stand-in for the layer's attributes), so the
  base tree yields specs without max_tp_shards and the patched tree yields
  whatever its layers declare;
- the KV cache config comes from get_kv_cache_configs, for every TP rank;
- the layout from build_offloading_config, and the sizes (host copies
  included) from a real CPUOffloadingSpec with 1 GiB of `cpu_bytes_to_use`:
  its rows (a chunk of any KV cache group takes one), or, where the tree has
  one (the 0.34.0 series), its host layout (`spec.layout`: host units, the
  units a chunk of each group takes, each layer's copies and their writers).
The CPU offloading spec only dedups through its shared host region, which it
enables on CUDA hosts (0.30.0: is_cuda_alike(); 0.34.0: also XPU, not ROCm);
this machine has none, so the worker models a CUDA host by reporting that
region as available.

One accounting for every tree: a chunk of tokens is a chunk of EVERY
offloaded KV cache group (a hybrid's state groups and its attention group, a
DeepSeek-V4-like model's compressed and sliding-window groups), and the host
bytes per chunk of tokens are what the spec reserves for all of them.

It runs in vLLM 0.30.0 and 0.34.0 trees, with or without our series: where
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
# (first line, in full), with where vLLM raises it (0.30.0 and 0.34.0 reject
# the same combinations with the same messages). Any other exception
# is a failure of the demo or of its environment (say, a pydantic
# ValidationError from a ModelConfig that finds no model config) and stops it.
REJECTED_BY_DESIGN = (
    # SlidingWindowSpec.max_memory_usage_bytes (vllm/v1/kv_cache_interface.py;
    # 0.34.0: line 964, for specs with dcp_sharded, the default): DCP does not
    # support sliding-window attention (DeepSeek-V4's SWA cache).
    (AssertionError, r"DCP not support sliding window\."),
    # build_offloading_config
    # (vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py;
    # 0.34.0: line 115):
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
                # The backend's fp8_ds_mla row (read by 0.34.0).
                impl=_ds_mla_impl(),
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
            # (0.34.0: tp_replicated=False, the state is sharded).
            specs[f"{name}.mixer"] = MambaSpec(
                block_size=block,
                shapes=((3, 10240 // tp), (128 // tp, 64, 128)),
                dtypes=(torch.bfloat16, torch.float32),
            )
        else:
            raise ValueError(kind)
    return specs


def _ds_mla_impl() -> Any:
    """A stand-in for the MLA backend's impl, whose fp8_ds_mla row size
    0.34.0's MLAAttention reads: the size of the tree's MLAAttentionImpl
    (the backends DeepSeek-V3.2 runs on in a GPU host; 656 bytes)."""

    def row_bytes() -> int:
        from vllm.v1.attention.backend import MLAAttentionImpl

        return MLAAttentionImpl.get_fp8_ds_mla_row_bytes(None)  # type: ignore[arg-type]

    return SimpleNamespace(get_fp8_ds_mla_row_bytes=row_bytes)


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
    # With the model config, as in a model's constructor (0.34.0's CPU
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
    hosts: int = 1,
    pp: int = 1,
    executor: str = "mp",
) -> Any:
    """The configuration build_offloading_config reads, as upstream's tests
    build it: a real ParallelConfig on a stand-in VllmConfig; the `executor`
    (mp or Ray) on `hosts` nodes, TP `tp` x PP `pp`."""
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
    # Read by trees whose OffloadingModelConfig carries it (0.34.0).
    config.model_config.max_model_len = MAX_MODEL_LEN
    config.model_config.use_mla = arch.use_mla
    config.model_config.get_total_num_kv_heads.return_value = arch.kv_heads or 1
    with patch.object(current_platform, "device_count", return_value=tp * pp):
        config.parallel_config = ParallelConfig(
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            decode_context_parallel_size=dcp,
            distributed_executor_backend=executor,
        )
    if executor == "mp":
        # As `--nnodes`: set after validation, which asks for the nodes'
        # address.
        config.parallel_config.nnodes = hosts
    elif hasattr(config.parallel_config, "worker_node_ids"):
        # As the tree's Ray executor records it (the 0.34.0 series): the
        # driver's node's workers first, then each other node's.
        workers = tp * pp // hosts
        config.parallel_config.worker_node_ids = [
            f"node-{rank // workers}" for rank in range(tp * pp)
        ]
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
    plans it: 0.34.0 plans in kv_cache_planning, where the engine core
    groups the whole model's layers first and passes the groups in."""
    if importlib.util.find_spec("vllm.v1.core.kv_cache_planning") is None:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

        return get_kv_cache_configs(vllm_config, specs, memory)
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )

    groups = get_global_kv_cache_groups(vllm_config, specs)
    return get_kv_cache_configs(vllm_config, specs, memory, groups)


def _host_layout(spec) -> Any:
    """The spec's host layout, where the tree has one (the 0.34.0 series:
    HostLayout, host units of which a chunk of each offloaded group takes
    group_units); None where a chunk of any group takes one row."""
    layout = getattr(spec, "layout", None)
    return layout if hasattr(layout, "group_units") else None


def _row_copies(spec) -> int:
    """Host copies of each row, read off the CPU spec's own sizing (trees
    without a host layout): a row holds one worker page
    (cpu_page_size_per_worker) per copy, padded up to BLOCK_SIZE_ALIGNMENT,
    which is smaller than a page here, so the padding never amounts to
    another copy."""
    page = spec.cpu_page_size_per_worker
    assert 0 < spec.BLOCK_SIZE_ALIGNMENT <= page, (spec.BLOCK_SIZE_ALIGNMENT, page)
    copies = spec.kv_bytes_per_chunk // page
    # Where the tree names the replica group of each rank (0.30.0 series),
    # it sizes one copy per group.
    groups = getattr(spec, "host_replica_groups", ())
    assert not groups or copies == len(set(groups)), (copies, groups)
    return copies


def _host_copies(spec) -> int | float:
    """Host copies of each offloaded chunk, on all hosts together: a row's
    (one per rank, one per replica group, or one for all), or, read off a
    host layout, the copies of each layer weighted by its page (an int where
    every layer keeps as many), in each host's region."""
    layout = _host_layout(spec)
    if layout is None:
        return _row_copies(spec)
    held = pages = 0
    for stage in _stages(layout):
        layers = [layer for group in stage.group_layers for layer in group]
        held += _regions(spec) * sum(
            len(layer.offsets) * layer.page_bytes for layer in layers
        )
        pages += sum(layer.page_bytes for layer in layers)
    copies = held / pages
    return int(copies) if copies == int(copies) else round(copies, 2)


def _host_bytes(spec, offloading, tokens_per_chunk: int) -> dict[str, Any]:
    """What the spec reserves for a chunk of tokens, a chunk of EVERY
    offloaded KV cache group: its host units (rows where the tree has no
    layout: one per chunk of any group; with a layout, each group's
    group_units), their bytes, and the tokens that fit in cpu_bytes_to_use
    (the whole chunks of every group the spec's num_chunks units hold)."""
    layout = _host_layout(spec)
    if layout is None:
        units = len(offloading.groups)
    else:
        # A unit of the shared region is a row of kv_bytes_per_chunk bytes.
        assert spec.kv_bytes_per_chunk == layout.unit_bytes, (
            spec.kv_bytes_per_chunk,
            layout.unit_bytes,
        )
        units = sum(layout.group_units)
    per_chunk = chunk_host_bytes(spec, units)
    # Under PP (the 0.34.0 series), each stage's units of its own: the
    # chunks of every group the stage that holds the fewest holds.
    tokens_per_gib = (
        min(
            n // sum(stage.group_units)
            for n, stage in zip(spec.stage_num_chunks, layout.stages)
        )
        if len(getattr(spec, "pools", ())) > 1
        else spec.num_chunks // units
    ) * tokens_per_chunk
    assert tokens_per_gib == GiB // per_chunk * tokens_per_chunk, (units, per_chunk)
    return {
        "host_units_per_chunk": units,
        "host_bytes_per_chunk": per_chunk,
        "host_bytes_per_token": per_chunk / tokens_per_chunk,
        "tokens_per_gib": tokens_per_gib,
    }


def chunk_host_bytes(spec, units: int) -> int:
    """The host bytes of `units` units (rows) of the spec: where each host
    (and, under PP, each stage) keeps its workers' copies in a region of its
    own (the 0.34.0 series), the units in each. Under PP, where each stage
    has units of its own (the series), those of a chunk of every group on
    every stage (`units` is then the first stage's)."""
    if len(getattr(spec, "pools", ())) > 1:
        return _regions(spec) * sum(
            stage.unit_bytes * sum(stage.group_units) for stage in spec.layout.stages
        )
    return units * spec.kv_bytes_per_chunk * _regions(spec)


def _regions(spec) -> int:
    """The host regions of one stage laid out alike, one per host where each
    host keeps its own workers' copies (the 0.34.0 series on several hosts),
    else 1."""
    return getattr(spec, "stage_regions", getattr(spec, "hosts", 1))


def _stages(layout) -> tuple:
    """Every pipeline stage's host layout (the 0.34.0 series under PP), or
    the one layout."""
    return getattr(layout, "every_stage", (layout,))


def _store_traffic(layout, region_workers: int, tokens_per_chunk: int, regions: int):
    """Device-to-host bytes per offloaded token under a host layout, of all
    ranks together and of the busiest rank: each copy of each layer is
    written once per chunk, its writers (LayerCopies.writers) taking turns
    chunk by chunk, so that over many chunks each writes 1/len(writers) of
    them; each stage's layout is each of `regions` regions', whose
    `region_workers` workers hold copies of their own."""
    busiest = 0.0
    total = 0
    for stage in _stages(layout):
        ranks = [0.0] * region_workers
        for group in stage.group_layers:
            for layer in group:
                chunk = layer.page_bytes * stage.blocks_per_chunk
                for copy in range(len(layer.offsets)):
                    writers = layer.writers(copy)
                    assert writers, (layer, copy)
                    total += chunk
                    for rank in writers:
                        ranks[rank] += chunk / len(writers)
        busiest = max(busiest, *ranks)
    return total * regions / tokens_per_chunk, busiest / tokens_per_chunk


def _offloaded_layers(kv_cache_config, offloading) -> list[list[tuple[str, Any]]]:
    """Per offloaded KV cache group (offloading.groups' order), each layer's
    name and its own spec (a worker's config keeps a uniform-type group's
    layer specs)."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    out = []
    for group_config in offloading.groups:
        group = kv_cache_config.kv_cache_groups[group_config.group_id]
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            out.append(
                [(name, spec.kv_cache_specs[name]) for name in group.layer_names]
            )
        else:
            out.append([(name, spec) for name in group.layer_names])
    return out


def _layer_page_bytes(spec) -> int:
    """The bytes one rank stores of a layer per block, padding excluded:
    AttentionSpec's unpadded page, a MambaSpec's state bytes."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    if isinstance(spec, AttentionSpec):
        return spec.unpadded_page_size_bytes
    if isinstance(spec, MambaSpec):
        return dataclasses.replace(spec, page_size_padded=None).page_size_bytes
    raise TypeError(f"no page size for {type(spec).__name__}")


def _kind(arch: architectures.Arch, name: str) -> tuple[str, str]:
    """A layer's kind (bench/architectures.py) and its cache, from its name
    (model.layers.<i>.<cache>)."""
    _, _, index, cache = name.split(".")
    return arch.layers[int(index)], cache


def _limit_bytes_per_chunk(
    arch: architectures.Arch,
    layers,
    tp: int,
    dcp: int,
    blocks_per_chunk: int,
    hosts: int,
) -> int:
    """The physical limit, the distinct bytes the model's layers hold per
    chunk of tokens, counted on each host that needs them: over every
    offloaded group and each of its layers, the layer's page without padding,
    for each block of the chunk, times the distinct pieces it splits into by
    the model's math on each of `hosts` hosts (architectures.distinct_shards)."""
    return sum(
        _layer_page_bytes(spec)
        * blocks_per_chunk
        * architectures.distinct_shards(_kind(arch, name)[0], arch, tp, dcp, hosts)
        for group in layers
        for name, spec in group
    )


def _pipeline_stages(
    arch: architectures.Arch, specs: dict[str, Any], pp: int
) -> list[dict[str, Any]]:
    """Each pipeline stage's layer specs: the model's layers split as the
    tree's own get_pp_indices splits them, its drafts on the last stage."""
    if pp == 1:
        return [specs]
    from vllm.distributed.utils import get_pp_indices

    layers = len(arch.layers) - arch.drafts
    stages: list[dict[str, Any]] = [{} for _ in range(pp)]
    for name, spec in specs.items():
        index = int(name.split(".")[2])
        stage = next(
            (s for s in range(pp) if index < get_pp_indices(layers, s, pp)[1]),
            pp - 1,
        )
        stages[stage][name] = spec
    return stages


class _RegionNamed(Exception):
    pass


def _region_name(spec) -> str:
    """The name of the host region ``spec``'s worker would map, as the
    tree's own create_worker names it (0.30.0's asks for the device first)."""
    from vllm.v1.kv_offload.cpu import spec as spec_module

    def named(engine_id: str, **kwargs):
        raise _RegionNamed(engine_id)

    with (
        patch.object(spec_module, "SharedOffloadRegion", side_effect=named),
        patch.object(type(spec), "_uses_shared_region", return_value=True),
        patch.object(torch.accelerator, "current_device_index", return_value=0),
    ):
        try:
            spec.create_worker(MagicMock())
        except _RegionNamed as region:
            return region.args[0]
    raise AssertionError("create_worker mapped no shared region")


def _stages_agree(arch, tp, dcp, block_size, hosts, pp, configs, scheduler) -> bool:
    """Whether the workers of every stage lay out a region they share on one
    host alike (the same rows), with at least the scheduler's rows: each
    stage's first worker's spec, from the tree's own code, against the
    others mapping the same region file on the same host."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    regions: dict[tuple[int, str], tuple[int, int]] = {}
    agree = True
    for stage in range(pp):
        rank = stage * tp
        config = _offloading_vllm_config(
            arch, tp, dcp, block_size=block_size, hosts=hosts, pp=pp
        )
        config.parallel_config.rank = rank
        with patch.object(CPUOffloadingSpec, "_uses_shared_region", return_value=True):
            spec = CPUOffloadingSpec(build_offloading_config(config, configs[rank]))
        # The release names the region by the engine, the series by its
        # stage and host too.
        name = _region_name(spec)
        host = rank // (tp * pp // hosts)
        rows = (spec.num_chunks, spec.kv_bytes_per_chunk)
        agree &= regions.setdefault((host, name), rows) == rows
        # The units the scheduler hands out of the stage's regions (the
        # series gives each stage units of its own).
        handed = getattr(scheduler, "stage_num_chunks", None)
        agree &= spec.num_chunks >= (handed[stage] if handed else scheduler.num_chunks)
    return agree


def plan(
    arch: architectures.Arch,
    tp: int,
    dcp: int,
    pp: int = 1,
    memory: int = 64 * GiB,
    layout: str = "BLNHC",
):
    """The block size and every worker's KV cache config of ``arch`` at TP
    ``tp`` x PP ``pp`` (DCP ``dcp``), as this tree's engine core plans them
    for ``memory`` bytes of KV cache per worker in ``layout``."""
    from vllm.config import VllmConfig

    if arch.model_dir is None:
        vllm_config = VllmConfig(model_config=_model_config())
        vllm_config.parallel_config.tensor_parallel_size = tp
        vllm_config.parallel_config.decode_context_parallel_size = dcp
        vllm_config.cache_config.block_size = arch.block_size
        specs = _layer_specs(arch, tp)
    else:
        vllm_config = _hybrid_config(arch, tp, dcp)
        specs = _layer_specs(arch, tp, vllm_config)
    # Block-outermost by default, as the engine core resolves it for these
    # hybrid models; it lets mixed page sizes pack into one block.
    vllm_config.cache_config.kv_cache_layout = layout
    # Every worker's specs: its stage's (rank = stage * tp + TP rank).
    stages = _pipeline_stages(arch, specs, pp)
    workers = [stages[rank // tp] for rank in range(tp * pp)]
    configs = _kv_cache_configs(vllm_config, workers, [memory] * len(workers))
    return vllm_config.cache_config.block_size, configs


def measure(
    arch: architectures.Arch,
    tp: int,
    dcp: int,
    hosts: int,
    pp: int = 1,
    ray: bool = False,
) -> dict[str, Any]:
    """The row of `arch` at TP `tp`, DCP `dcp` on `hosts` hosts with PP `pp`
    under the mp executor; with `ray`, also what the same KV cache configs
    take under the Ray executor (row["ray"])."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    block_size, configs = plan(arch, tp, dcp, pp)
    # The first worker's: the scheduler's, as the engine core copies it.
    kv_cache_config = configs[0]

    def offload(executor: str):
        offloading = build_offloading_config(
            _offloading_vllm_config(
                arch,
                tp,
                dcp,
                block_size=block_size,
                hosts=hosts,
                pp=pp,
                executor=executor,
            ),
            kv_cache_config,
        )
        with patch.object(CPUOffloadingSpec, "_uses_shared_region", return_value=True):
            return offloading, CPUOffloadingSpec(offloading)

    def replicated_layout(offloading, spec) -> bool:
        # One host copy serves every rank (the release and 0.30.0: the
        # spec's row of one block; the 0.34.0 series: every layer's plan).
        return bool(
            getattr(spec, "replicated_layout", False)
            or getattr(offloading, "replicated_layout", False)
        )

    offloading, spec = offload("mp")
    # A chunk of tokens is a chunk of every offloaded group; every group of
    # these models spans the same tokens per block (a hybrid's state blocks
    # are aligned to its attention blocks).
    tokens_per_block = {g.tokens_per_block for g in offloading.groups}
    assert len(tokens_per_block) == 1, tokens_per_block
    (tokens_per_block,) = tokens_per_block
    blocks_per_chunk = offloading.cache.blocks_per_chunk
    tokens_per_chunk = tokens_per_block * blocks_per_chunk
    # Every stage's offloaded layers, each from its first worker's config.
    layers = [
        group
        for stage in range(pp)
        for group in _offloaded_layers(configs[stage * tp], offloading)
    ]
    layout = _host_layout(spec)
    row = {
        "kv_tp_replicas": getattr(kv_cache_config, "kv_tp_replicas", None),
        # The replica group of each TP rank, where the tree plans one for
        # every layer at once (0.30.0 series).
        "kv_tp_replica_groups": list(
            getattr(kv_cache_config, "kv_tp_replica_groups", ())
        )
        or None,
        "replicated_layout": replicated_layout(offloading, spec),
        "offloaded_groups": len(offloading.groups),
        "tokens_per_chunk": tokens_per_chunk,
        # Host copies of each chunk: one per rank, one per replica group it
        # shares, one in all for the replicated layout; weighted by each
        # layer's page where each layer keeps its own (a host layout).
        "host_copies": _host_copies(spec),
        **_host_bytes(spec, offloading, tokens_per_chunk),
        # One rank's block of one group, padding included, per token.
        "worker_bytes_per_token": offloading.worker_kv_bytes_per_block
        / tokens_per_block,
        # The physical limit: every distinct piece of KV stored once.
        # (Each stage on its share of the hosts.)
        "limit_bytes_per_token": _limit_bytes_per_chunk(
            arch, layers, tp, dcp, blocks_per_chunk, max(1, hosts // pp)
        )
        / tokens_per_chunk,
        "canonical": _canonical_layout(
            arch, tp, dcp, configs, tokens_per_chunk, block_size, hosts, pp
        ),
        "layer_classes": _layer_classes(arch, offloading, layout),
    }
    if ray:
        # The same deployment under the Ray executor, which records each
        # worker's node (the 0.34.0 series reads it).
        ray_offloading, ray_spec = offload("ray")
        host = _host_bytes(ray_spec, ray_offloading, tokens_per_chunk)
        row["ray"] = {
            "tokens_per_gib": host["tokens_per_gib"],
            "host_bytes_per_token": host["host_bytes_per_token"],
            "replicated_layout": replicated_layout(ray_offloading, ray_spec),
        }
    if pp > 1:
        row["stages_agree"] = _stages_agree(
            arch, tp, dcp, block_size, hosts, pp, configs, spec
        )
    if layout is not None:
        # The layout itself: its unit, the units and bytes (every copy of
        # every layer) of a chunk of each offloaded group.
        row["host_layout"] = {
            "unit_bytes": layout.unit_bytes,
            "group_units": list(layout.group_units),
            "group_bytes": list(layout.group_bytes),
        }
        (
            row["store_bytes_per_token"],
            row["busiest_rank_store_bytes_per_token"],
        ) = _store_traffic(
            layout,
            getattr(offloading, "region_workers", 0)
            or offloading.parallel.world_size // _regions(spec),
            tokens_per_chunk,
            _regions(spec),
        )
    return row


def _layer_classes(arch: architectures.Arch, offloading, layout):
    """The host copies each class of layers keeps (those with equal replica
    groups), read off the host layout (the 0.34.0 series, which lays out each
    layer's copies per replica group of the layer's plan,
    KVCacheConfig.layer_tp_replica_groups; None where the tree has no
    layout): per class, its copies, the replica group of each rank, and its
    layers by kind (and cache, where a layer has several), in the order of
    their first layer."""
    if layout is None:
        return None
    classes: dict[tuple[int, ...], dict[str, Any]] = {}
    stage_groups = getattr(offloading, "stage_groups", ()) or (offloading.groups,)
    for groups, stage in zip(stage_groups, _stages(layout), strict=True):
        for group, group_layers in zip(groups, stage.group_layers, strict=True):
            for name, layer in zip(group.layer_names, group_layers, strict=True):
                kind, cache = _kind(arch, name)
                what = kind if cache in ("attn", "mixer") else f"{kind} {cache}"
                entry = classes.setdefault(
                    layer.replica_groups,
                    {
                        "copies": len(layer.offsets),
                        "replica_groups": list(layer.replica_groups),
                        "layers": {},
                    },
                )
                assert entry["copies"] == len(layer.offsets), name
                entry["layers"][what] = entry["layers"].get(what, 0) + 1
    return list(classes.values())


def _canonical_layout(
    arch,
    tp: int,
    dcp: int,
    configs,
    tokens_per_chunk: int,
    block_size: int,
    hosts: int,
    pp: int = 1,
):
    """What the tree's canonical CPU layout (TieringOffloadingSpec with
    canonical_layout, upstream's strongest configuration) reserves for a
    chunk of every offloaded group, decided by its own
    build_offloading_config on a worker's KV cache config and on the
    scheduler's (one spec per group)."""
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
            hosts,
            pp,
        )
        offloading = build_offloading_config(config, kv_cache_config)
        spec = TieringOffloadingSpec(offloading)
        host = _host_bytes(spec, offloading, tokens_per_chunk)
        out[side] = {
            # The canonical spec shares the config's layout: always a shared
            # region (0.34.0 names it on the spec too).
            "replicated_layout": offloading.replicated_layout,
            "parallelism_agnostic": offloading.parallel.is_parallelism_agnostic,
            "host_copies": _host_copies(spec),
            "host_bytes_per_token": host["host_bytes_per_token"],
            "tokens_per_gib": host["tokens_per_gib"],
        }
    out["agree"] = out["worker"] == out["scheduler"]
    return out


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
                for pp, hosts in architectures.deployments_of(tp):
                    row: dict[str, Any] = {
                        "arch": arch.name,
                        "tp": tp,
                        "dcp": dcp,
                        "hosts": hosts,
                        "pp": pp,
                    }
                    try:
                        # The usual deployment under Ray too.
                        usual = (tp, hosts) == (arch.usual_tp, arch.usual_hosts)
                        ray = usual and pp == 1 and dcp == 1
                        row.update(measure(arch, tp, dcp, hosts, pp, ray=ray))
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
