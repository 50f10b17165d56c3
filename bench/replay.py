"""Runs inside one vLLM tree (whichever `import vllm` finds): replays the
request traces of bench/workloads.py through that tree's own scheduler and
KV offloading, and writes, as JSON, what hit where (bench/bench.py runs it
in the release tree and in the series tree and compares).

For each job (a deployment of bench/architectures.py at a TP size, a
workload, and the host caches to try):
- the KV cache config comes from the tree's planner, as in the demo
  (bench/kv_tp_worker.py), for the GPU memory bench/costs.py gives each
  rank, divided by the job's slice (below);
- vLLM's Scheduler runs with the OffloadingConnector's scheduler side and
  the tree's own CPUOffloadingSpec and manager (LRU or ARC), sized by
  `cpu_bytes_to_use` as the tree sizes it (its host layout, its copies),
  modelling a CUDA host as the demo does;
- a stand-in worker completes every load and store in the step that
  submits it (no GPU; time is bench/costs.py's model, not the replay's).

The replay is event ordered: each turn arrives when its session's previous
answer is done plus its think time, and runs to its first token before the
next arrival (its answer is timed by bench/costs.py, not decoded; the
request leaves the GPU at its first token). Each request's prompt tokens
split into GPU prefix-cache hits, host hits (loaded by the connector) and
computed tokens, read off the scheduler's own prefill stats.

A slice: a job replays 1/slice of the deployment's sessions with 1/slice of
its GPU KV cache and host memory (sessions are independent, so hit rates
carry over, as in spatially sampled cache simulation); TTFT is per request
and needs no scaling.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import sys
import time
from pathlib import Path
from typing import Any
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import architectures
import costs
import kv_tp_worker
import workloads
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

# The sampled token; any id outside the traces' ranges.
SAMPLED_TOKEN = 1
# Token ids (vLLM keeps them as int32): shared prefix p holds
# PREFIX_BASE * (p + 1) + j; the j-th token of session i's own is
# SESSION_BASE + i + j. The first token after a prefix tells every session
# apart, and the chained block hashes keep what follows apart.
PREFIX_BASE = 1 << 16
SESSION_BASE = 1 << 24
# The context of the model the replay serves (workloads.Shape.max_context
# and the answer).
MAX_MODEL_LEN = 131072


class ReplayCPUOffloadingSpec(CPUOffloadingSpec):
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
            "spec_name": ReplayCPUOffloadingSpec.__name__,
            "spec_module_path": "replay",
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


class Conversations:
    """Each session's tokens and their block hashes, built as far as a turn
    needs and kept for every replay of the job (the hashes are vLLM's own,
    hash_block_tokens with sha256, chained from NONE_HASH)."""

    def __init__(self, sessions, prefix_tokens: int, hash_block_size: int):
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import init_none_hash

        init_none_hash(sha256)
        self.sessions = sessions
        self.prefix_tokens = prefix_tokens
        self.hash_block_size = hash_block_size
        self.tokens: dict[int, list[int]] = {}
        self.hashes: dict[int, list[Any]] = {}
        self.prompts: dict[tuple[int, int], int] = {}

    def prompt(self, i: int, k: int) -> tuple[list[int], list[Any]]:
        """Session i's prompt of turn k: its tokens and full-block hashes."""
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import hash_block_tokens

        session = self.sessions[i]
        tokens = self.tokens.get(i)
        if tokens is None:
            base = PREFIX_BASE * (session.prefix + 1)
            tokens = list(range(base, base + self.prefix_tokens))
            self.tokens[i], self.hashes[i] = tokens, []
            own = SESSION_BASE + i - len(tokens)
            for turn in session.turns:
                for n in (turn.new_tokens, turn.answer_tokens):
                    start = own + len(tokens)
                    tokens.extend(range(start, start + n))
            # Turn k's prompt ends after its new tokens.
            end = self.prefix_tokens
            for j, turn in enumerate(session.turns):
                end += turn.new_tokens
                self.prompts[i, j] = end
                end += turn.answer_tokens
        end = self.prompts[i, k]
        hashes = self.hashes[i]
        size = self.hash_block_size
        while (len(hashes) + 1) * size <= end:
            start = len(hashes) * size
            parent = hashes[-1] if hashes else None
            hashes.append(
                hash_block_tokens(sha256, parent, tokens[start : start + size])
            )
        return tokens[:end], hashes[: end // size]


def _stand_in_worker_output(scheduler_output, world_size: int):
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


def replay(
    job: dict[str, Any], conversations: Conversations, cpu_bytes: int, policy: str
):
    """One replay of the job's sessions with `cpu_bytes` of host memory:
    per measured request, (session, turn, prompt tokens, GPU hits, host
    hits, TTFT), the scheduler steps, and the host units the manager has."""
    from vllm import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    arch = _arch(job["arch"])
    tp = job["tp"]
    scheduler, kv_cache_config, _ = build_scheduler(
        arch,
        tp,
        job["gpu_bytes"],
        cpu_bytes,
        policy,
        job["max_model_len"],
        job.get("hosts", 1),
    )
    compute = costs.COMPUTE[arch.name]
    rank_bytes_per_token = _rank_bytes_per_token(scheduler, kv_cache_config)
    world_size = scheduler.vllm_config.parallel_config.world_size
    sessions = conversations.sessions
    events = [(s.start_s, i, 0) for i, s in enumerate(sessions)]
    heapq.heapify(events)
    records = []
    steps = 0
    request_id = 0
    while events:
        now, i, k = heapq.heappop(events)
        tokens, hashes = conversations.prompt(i, k)
        request = Request(
            str(request_id),
            tokens,
            SamplingParams(max_tokens=1),
            None,
            arrival_time=now,
            block_hashes=list(hashes),
        )
        request_id += 1
        scheduler.add_request(request)
        stats = None
        while scheduler.has_requests():
            output = scheduler.schedule()
            steps += 1
            # The scheduler's own split of the prompt, set when it first
            # schedules the request (a load first, where the host hits).
            prefill = request.prefill_stats
            if stats is None and prefill is not None and prefill.num_prompt_tokens:
                stats = (
                    prefill.num_local_cached_tokens,
                    prefill.num_external_cached_tokens,
                )
            req_ids = list(output.num_scheduled_tokens)
            sampled = []
            for req_id in req_ids:
                r = scheduler.requests[req_id]
                done = r.num_computed_tokens >= r.num_prompt_tokens
                sampled.append([SAMPLED_TOKEN] if done else [])
            scheduler.update_from_output(
                output,
                ModelRunnerOutput(
                    req_ids=req_ids,
                    sampled_token_ids=sampled,
                    kv_connector_output=_stand_in_worker_output(output, world_size),
                ),
            )
        assert stats is not None, f"request {request_id - 1} was never scheduled"
        gpu_hits, host_hits = stats
        prompt = len(tokens)
        computed = prompt - gpu_hits - host_hits
        ttft = costs.load_seconds(
            host_hits * rank_bytes_per_token
        ) + costs.prefill_seconds(compute, tp, gpu_hits + host_hits, computed)
        turn = sessions[i].turns[k]
        if now >= job["warmup_s"]:
            records.append((i, k, prompt, gpu_hits, host_hits, ttft))
        if k + 1 < len(sessions[i].turns):
            answer = turn.answer_tokens * costs.decode_seconds_per_token(
                compute, tp, (prompt + turn.answer_tokens / 2) * rank_bytes_per_token
            )
            nxt = sessions[i].turns[k + 1]
            heapq.heappush(events, (now + ttft + answer + nxt.think_s, i, k + 1))
    manager = scheduler.connector.connector_scheduler.manager
    return records, steps, getattr(manager, "_num_chunks", None)


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[index]


def summarize(records) -> dict[str, Any]:
    prompt = sum(r[2] for r in records)
    gpu = sum(r[3] for r in records)
    host = sum(r[4] for r in records)
    ttfts = [r[5] for r in records]
    return {
        "requests": len(records),
        "prompt_tokens": prompt,
        "gpu_hit_tokens": gpu,
        "host_hit_tokens": host,
        "computed_tokens": prompt - gpu - host,
        "gpu_hit_rate": gpu / prompt if prompt else 0.0,
        "host_hit_rate": host / prompt if prompt else 0.0,
        "ttft_p50_s": _percentile(ttfts, 0.5),
        "ttft_p90_s": _percentile(ttfts, 0.9),
    }


# The traffic: sessions arrive at the rate whose distinct tokens (what no
# cache can serve: each session's own tokens, computed once) would take
# OFFERED_LOAD of the deployment's peak prefill (bench/costs.py), over
# SPAN_S seconds, of which the first WARMUP fill the caches and are not
# measured. Chosen, not measured.
OFFERED_LOAD = 0.5
SPAN_S = 1800.0
WARMUP = 1 / 3
# A slice must leave the GPU cache room for the trace's longest prompt (a
# request's blocks are all on the GPU at once; the replay runs one request
# at a time), with this margin.
GPU_HEADROOM = 1.25


def plan_job(job: dict[str, Any]) -> dict[str, Any]:
    """The job's traffic and slice, from the deployment's compute and its
    full-size GPU KV cache (the same in every tree: the series does not
    change KV cache planning). The slice replays about
    job["target_tokens"] prompt tokens; where the GPU cache bounds it, the
    span shrinks instead."""
    arch = _arch(job["arch"])
    tp = job["tp"]
    compute = costs.COMPUTE[arch.name]
    shape = workloads.WORKLOADS[job["workload"]]
    gpu_bytes = costs.gpu_kv_bytes(compute, tp)
    full_gpu_tokens = gpu_tokens(arch, tp, int(gpu_bytes))
    stats = workloads.session_stats(shape)
    rate = OFFERED_LOAD * costs.peak_prefill_tokens_per_s(compute, tp) / stats.distinct
    by_budget = max(1.0, rate * SPAN_S * stats.prompt / job["target_tokens"])
    by_gpu = max(1.0, full_gpu_tokens / (GPU_HEADROOM * stats.longest))
    slice_ = min(by_budget, by_gpu)
    span = SPAN_S * min(1.0, by_gpu / by_budget)
    return {
        "slice": slice_,
        "gpu_bytes": int(gpu_bytes / slice_),
        "gpu_tokens_full": full_gpu_tokens,
        "sessions_per_s_full": rate,
        "sessions_per_s": rate / slice_,
        "span_s": span,
        "warmup_s": span * WARMUP,
    }


def _trace(job: dict[str, Any]) -> list[workloads.Session]:
    """The job's sessions: its own `trace` (tests), or generated."""
    if "trace" in job:
        return [
            workloads.Session(
                s["start_s"],
                s["prefix"],
                tuple(workloads.Turn(*turn) for turn in s["turns"]),
            )
            for s in job["trace"]
        ]
    return workloads.generate(
        workloads.WORKLOADS[job["workload"]],
        job["sessions_per_s"],
        job["span_s"],
        job["seed"],
    )


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Every replay of a job. A job with its own `trace` (a list of
    sessions, and its `prefix_tokens`, `gpu_bytes` and `warmup_s`) runs at
    that size (slice 1); with `records`, the result lists each measured
    request."""
    if "trace" not in job:
        job = {**job, **plan_job(job)}
        prefix_tokens = workloads.WORKLOADS[job["workload"]].prefix_tokens
    else:
        job = {"slice": 1, **job}
        prefix_tokens = job["prefix_tokens"]
    sessions = _trace(job)
    # Room for the trace's longest prompt (and the sampled token).
    job["max_model_len"] = 1 + max(s.longest_prompt(prefix_tokens) for s in sessions)
    # One scheduler of the job's size, for its hash block and the host
    # bytes its spec takes a chunk.
    _, _, hash_block_size = build_scheduler(
        _arch(job["arch"]),
        job["tp"],
        job["gpu_bytes"],
        1 << 30,
        "lru",
        job["max_model_len"],
        job.get("hosts", 1),
    )
    spec = ReplayCPUOffloadingSpec.last
    assert spec is not None
    chunk_bytes = spec.chunk_bytes()
    conversations = Conversations(sessions, prefix_tokens, hash_block_size)
    results = []
    for cache in job["caches"]:
        started = time.perf_counter()
        if "chunks" in cache:
            # A host cache of that many chunks, as this tree sizes them.
            cpu_bytes = cache["chunks"] * chunk_bytes
        else:
            # Host memory of the whole deployment, sliced as its traffic.
            cpu_bytes = max(1, int(cache["host_bytes"] / job["slice"]))
        records, steps, chunks = replay(job, conversations, cpu_bytes, cache["policy"])
        result = {
            **cache,
            **summarize(records),
            "host_chunks": chunks,
            "steps": steps,
            "seconds": time.perf_counter() - started,
        }
        if job.get("records"):
            result["records"] = records
        results.append(result)
    job.pop("trace", None)
    return {**job, "sessions": len(sessions), "results": results}


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
        jobs.append(run_job(job))
        if args.progress:
            with args.progress.open("a") as f:
                f.write(f"{job['arch']}, {job.get('workload', 'trace')}\n")
    out = {"vllm": str(Path(vllm.__file__).parent.parent), "jobs": jobs}
    # vLLM logs to stdout, so the result goes to a file.
    args.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    # Run as the module the offloading spec factory imports (spec_module_path),
    # so that there is one ReplayCPUOffloadingSpec class.
    import replay

    sys.exit(replay.main())
