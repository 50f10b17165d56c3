"""Runs inside one vLLM tree (whichever `import vllm` finds): what that tree
gives each deployment of `make bench` (bench/bench.py runs it in the
release tree and in the series tree): the tokens its GPU KV cache holds, as
the tree's planner plans it for the memory bench/costs.py gives each rank,
and the host memory a chunk of tokens takes of `cpu_bytes_to_use`, as the
tree's own CPUOffloadingSpec lays it out behind vLLM's Scheduler and the
OffloadingConnector's scheduler side (modelling a CUDA host, as the demo
does). Writes them as JSON; bench/trace_replay.py replays the trace with them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import architectures
import costs
import kv_tp_worker
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

# The context of the model each deployment serves (the trace's longest
# request is 126,195 tokens with its answer).
MAX_MODEL_LEN = 131072


class BenchCPUOffloadingSpec(CPUOffloadingSpec):
    """The tree's CPUOffloadingSpec on a modelled CUDA host: its shared host
    region, on which it lays out shared copies, counts as available (as in
    bench/kv_tp_worker.py). The scheduler side never maps it."""

    # The last one built (the replay reads its sizing).
    last: CPUOffloadingSpec | None = None

    def __init__(self, config) -> None:
        super().__init__(config)
        type(self).last = self

    def _uses_shared_region(self) -> bool:
        return True

    def chunk_bytes(self) -> int:
        """What a chunk of every offloaded group takes of cpu_bytes_to_use
        (bench/kv_tp_worker.py's accounting): its host units with a host
        layout (the 0.34.0 series), else a row per group."""
        layout = kv_tp_worker._host_layout(self)
        units = len(self.config.groups) if layout is None else sum(layout.group_units)
        return kv_tp_worker.chunk_host_bytes(self, units)


def _arch(name: str) -> architectures.Arch:
    (arch,) = [a for a in architectures.ARCHITECTURES if a.name == name]
    return arch


def plan_kv_cache(
    arch: architectures.Arch, tp: int, gpu_bytes: int, max_model_len: int
):
    """TP rank 0's view of the KV cache as the tree's engine core plans it
    for `gpu_bytes` a rank (every rank's config, and the scheduler's made
    of them), and the config it was planned with."""
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
    from vllm.v1.kv_cache_interface import MambaSpec

    if arch.model_dir is None:
        config = _plain_config(tp, arch.block_size)
        specs = kv_tp_worker._layer_specs(arch, tp)
    else:
        config = kv_tp_worker._hybrid_config(arch, tp, 1)
        specs = kv_tp_worker._layer_specs(arch, tp, config)
    config.cache_config.kv_cache_layout = "BLNHC"
    config.model_config.max_model_len = max_model_len
    # What vLLM requires of a hybrid's state caches for prefix caching, as
    # its layers read it from the cache config.
    config.cache_config.mamba_cache_mode = "align"
    specs = {
        name: dataclasses.replace(spec, mamba_cache_mode="align")
        if isinstance(spec, MambaSpec)
        else spec
        for name, spec in specs.items()
    }
    kv_cache_config = generate_scheduler_kv_cache_config(
        kv_tp_worker._kv_cache_configs(config, [specs] * tp, [gpu_bytes] * tp)
    )
    return config, kv_cache_config


def _plain_config(tp: int, block_size: int):
    """The config a model without a published config plans with (the
    layer specs carry the architecture)."""
    from vllm.config import VllmConfig

    # One ModelConfig for the process (it inspects the model in a
    # subprocess); plan_kv_cache sets its max_model_len.
    config = VllmConfig(model_config=kv_tp_worker._model_config())
    config.parallel_config.tensor_parallel_size = tp
    config.cache_config.block_size = block_size
    return config


def gpu_tokens(arch: architectures.Arch, tp: int, gpu_bytes: int) -> int:
    """The tokens a rank's GPU KV cache of `gpu_bytes` holds."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    config, kv_cache_config = plan_kv_cache(arch, tp, gpu_bytes, MAX_MODEL_LEN)
    block_size, _ = resolve_kv_cache_block_sizes(kv_cache_config, config)
    return kv_cache_config.num_blocks * block_size


def build_scheduler(
    arch: architectures.Arch,
    tp: int,
    gpu_bytes: int,
    cpu_bytes: int,
    policy: str,
    max_model_len: int = MAX_MODEL_LEN,
    hosts: int = 1,
):
    """vLLM's Scheduler with the OffloadingConnector, for the KV cache
    plan_kv_cache plans, serving prompts of up to `max_model_len` tokens,
    the TP ranks on `hosts` hosts (the mp executor's `--nnodes`)."""
    from vllm.config import (
        DeviceConfig,
        KVTransferConfig,
        ParallelConfig,
        SchedulerConfig,
    )
    from vllm.platforms import current_platform
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    config, kv_cache_config = plan_kv_cache(arch, tp, gpu_bytes, max_model_len)
    with patch.object(current_platform, "device_count", return_value=tp):
        config.parallel_config = ParallelConfig(
            tensor_parallel_size=tp, distributed_executor_backend="mp"
        )
    # Set after validation, which asks for the nodes' address.
    config.parallel_config.nnodes = hosts
    config.scheduler_config = SchedulerConfig(
        max_num_seqs=256,
        max_num_batched_tokens=costs.MAX_NUM_BATCHED_TOKENS,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    config.device_config = DeviceConfig("cpu")
    config.cache_config.enable_prefix_caching = True
    config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        engine_id="replay",
        kv_connector_extra_config={
            "cpu_bytes_to_use": cpu_bytes,
            "eviction_policy": policy,
            "spec_name": BenchCPUOffloadingSpec.__name__,
            "spec_module_path": "sizing",
        },
    )
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, config)
    # The offloading connector reads whether the model uses MLA (the
    # release's single-copy layout is MLA only) from the model config, which
    # is a stand-in's here but for the hybrids: the architecture's, as the
    # demo gives it.
    with patch.object(
        type(config.model_config), "use_mla", property(lambda _: arch.use_mla)
    ):
        scheduler = Scheduler(
            vllm_config=config,
            kv_cache_config=kv_cache_config,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(config),
            block_size=block_size,
            hash_block_size=hash_block_size,
        )
    return scheduler, kv_cache_config, hash_block_size


def _rank_bytes_per_token(scheduler, kv_cache_config) -> float:
    """A rank's bytes of every offloaded layer per token (what it loads of a
    host hit), as the offloading connector counts them: its block of every
    offloaded group (OffloadingConfig.worker_kv_bytes_per_block; the
    KVCacheTensors overlay one allocation, each sized as all of it)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )

    offloading = build_offloading_config(scheduler.vllm_config, kv_cache_config)
    (tokens_per_block,) = {g.tokens_per_block for g in offloading.groups}
    return offloading.worker_kv_bytes_per_block / tokens_per_block


def size(job: dict[str, Any]) -> dict[str, Any]:
    """What this tree gives the job's deployment (its architecture, TP size
    and hosts): the tokens of its GPU KV cache, a rank's KV bytes a token,
    and the host memory a chunk of tokens takes of cpu_bytes_to_use (the
    deployment's, every host's together)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )

    arch = _arch(job["arch"])
    tp = job["tp"]
    gpu_bytes = int(costs.gpu_kv_bytes(costs.COMPUTE[arch.name], tp))
    scheduler, kv_cache_config, _ = build_scheduler(
        arch, tp, gpu_bytes, 1 << 30, "lru", MAX_MODEL_LEN, job["hosts"]
    )
    spec = BenchCPUOffloadingSpec.last
    assert spec is not None
    offloading = build_offloading_config(scheduler.vllm_config, kv_cache_config)
    (tokens_per_block,) = {g.tokens_per_block for g in offloading.groups}
    return {
        **job,
        "gpu_tokens": gpu_tokens(arch, tp, gpu_bytes),
        "rank_bytes_per_token": _rank_bytes_per_token(scheduler, kv_cache_config),
        "host_bytes_per_chunk": spec.chunk_bytes(),
        "tokens_per_chunk": tokens_per_block * offloading.cache.blocks_per_chunk,
    }


def _worker_output(scheduler_output, world_size: int):
    """What the workers would report for the step: every load and store the
    step submits done (each worker's count), and the requests whose
    asynchronous loads finished."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingWorkerMetadata,
    )
    from vllm.v1.outputs import KVConnectorOutput

    meta = scheduler_output.kv_connector_metadata
    done: dict[int, int] = {}
    received: set[str] = set()
    if meta is not None:
        for job_id in meta.store_jobs:
            done[job_id] = world_size
        for job_id, job in meta.load_jobs.items():
            done[job_id] = world_size
            if not job.sync:
                received.add(job.req_id)
    return KVConnectorOutput(
        finished_recving=received,
        kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done),
    )


def serve(job: dict[str, Any]) -> dict[str, Any]:
    """The job's `requests` (trace requests: input_length, hash_ids of
    `block_tokens`-token blocks) through vLLM's own Scheduler and
    OffloadingConnector, one after the other (each to its first token),
    with `gpu_bytes` a rank and each of `host_bytes` of host memory: per
    request, its GPU and host hit tokens, read off the scheduler's prefill
    stats. A stand-in worker completes every load and store in the step
    that submits it. Block id h holds tokens h * block_tokens + j."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    init_none_hash(sha256)
    arch = _arch(job["arch"])
    block = job["block_tokens"]
    results = []
    for host_bytes in job["host_bytes"]:
        scheduler, _, hash_block_size = build_scheduler(
            arch, job["tp"], job["gpu_bytes"], host_bytes, "lru", MAX_MODEL_LEN
        )
        world_size = scheduler.vllm_config.parallel_config.world_size
        hits = []
        for n, r in enumerate(job["requests"]):
            tokens = [
                h * block + j
                for k, h in enumerate(r["hash_ids"])
                for j in range(min(block, r["input_length"] - k * block))
            ]
            hashes: list[Any] = []
            for start in range(0, len(tokens) - hash_block_size + 1, hash_block_size):
                parent = hashes[-1] if hashes else None
                chunk = tokens[start : start + hash_block_size]
                hashes.append(hash_block_tokens(sha256, parent, chunk))
            request = Request(
                str(n),
                tokens,
                SamplingParams(max_tokens=1),
                None,
                block_hashes=hashes,
            )
            scheduler.add_request(request)
            stats = None
            while scheduler.has_requests():
                output = scheduler.schedule()
                prefill = request.prefill_stats
                if stats is None and prefill is not None and prefill.num_prompt_tokens:
                    stats = (
                        prefill.num_local_cached_tokens,
                        prefill.num_external_cached_tokens,
                    )
                req_ids = list(output.num_scheduled_tokens)
                sampled = []
                for req_id in req_ids:
                    q = scheduler.requests[req_id]
                    done = q.num_computed_tokens >= q.num_prompt_tokens
                    sampled.append([1] if done else [])
                scheduler.update_from_output(
                    output,
                    ModelRunnerOutput(
                        req_ids=req_ids,
                        sampled_token_ids=sampled,
                        kv_connector_output=_worker_output(output, world_size),
                    ),
                )
            assert stats is not None, f"request {n} was never scheduled"
            hits.append(stats)
        results.append({"host_bytes": host_bytes, "hits": hits})
    return {
        "arch": job["arch"],
        "gpu_tokens": gpu_tokens(arch, job["tp"], job["gpu_bytes"]),
        "serve": results,
    }


def main() -> int:
    import argparse

    import vllm

    parser = argparse.ArgumentParser()
    parser.add_argument("jobs", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--progress", type=Path, help="append a line here as each job ends"
    )
    args = parser.parse_args()
    jobs = []
    for job in json.loads(args.jobs.read_text()):
        jobs.append(serve(job) if "requests" in job else size(job))
        if args.progress:
            with args.progress.open("a") as f:
                f.write(f"{job['arch']}\n")
    out = {"vllm": str(Path(vllm.__file__).parent.parent), "jobs": jobs}
    # vLLM logs to stdout, so the result goes to a file.
    args.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    # Run as the module the offloading spec factory imports (spec_module_path),
    # so that there is one BenchCPUOffloadingSpec class.
    import sizing

    sys.exit(sizing.main())
