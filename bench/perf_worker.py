"""Runs inside one vLLM tree (whichever `import vllm` finds) and writes, as
JSON, to the file named by its argument, what the per-step paths of the KV
offloading connector cost in that tree, for each deployment of the demo's
summary (bench/architectures.py: each model at its usual TP size):

- the connector worker's submission of a store job and of a load job
  (OffloadingConnectorWorker: device pointers, the descriptors of every
  layer's pages, the handler's bookkeeping), on TP rank 0 and rank 1 (where
  0.34.0 keeps one host copy of an MLA model, rank 1 stores nothing), and
  the completion of the job (get_finished);
- the scheduler's manager per request: lookup, prepare_store, complete_store,
  prepare_load and complete_load of the chunks of every offloaded group, in
  steady state (the cache full, every store evicting);

with the runtime replica check off and, where the tree has one, on at the
rates asked. Each figure is the median of repeated runs, with the Python and
C calls and, for the worker, the copy descriptors of one run: counts do not
depend on the machine's load, times do.

What is modelled: no device. KV caches are host tensors standing in for the
device's (their addresses only), the copy kernel, streams and events are
stand-ins that do nothing, and the workers' regions are small (descriptors
are address arithmetic; nothing is copied). The layouts, specs and managers
are the tree's own, built by the tree's own code from the same KV cache
configs as the demo's.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import architectures
import kv_tp_worker

# Chunks of every offloaded group per job and per manager request.
JOB_CHUNKS = (16, 256)
REQUEST_CHUNKS = 64
REPEATS = 15
# With the runtime check on: its digests run on the host here, slowly.
CHECK_REPEATS = 3


class _Event:
    """A stand-in for torch.Event: done at once."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.0


class _Stream:
    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass


_PLATFORM = SimpleNamespace(
    Stream=_Stream,
    stream=lambda stream: contextlib.nullcontext(),
    current_stream=_Stream,
    is_xpu=lambda: False,
    is_rocm=lambda: False,
    is_cuda_alike=lambda: False,
)


def _counted(fn) -> tuple[int, int]:
    """The Python and C calls one run of ``fn`` makes."""
    calls = {"call": 0, "c_call": 0}

    def profile(frame, event, arg):
        if event in calls:
            calls[event] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls["call"], calls["c_call"]


def _repeats() -> int:
    return CHECK_REPEATS if _CHECKING else REPEATS


_CHECKING = False


def _timed(fn, setup=None) -> float:
    """The median microseconds of ``fn``, ``setup`` run untimed before each."""
    samples = []
    for _ in range(_repeats()):
        if setup is not None:
            setup()
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    return statistics.median(samples)


def _kv_caches(kv_cache_config, layout: str) -> dict[str, torch.Tensor]:
    """A worker's KV caches as its model runner allocates them, in host
    memory that is never touched (only their addresses are used)."""
    from vllm.v1.kv_cache_interface import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    return allocate_kv_cache(
        kv_cache_config,
        torch.device("cpu"),
        KVCacheLayout[layout],
        [group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups],
        allocate=lambda size: torch.empty(size, dtype=torch.int8),
    )


def _spec(config, kv_cache_config, extra: dict[str, Any]):
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    config.kv_transfer_config.kv_connector_extra_config.update(extra)
    offloading = build_offloading_config(config, kv_cache_config)
    with patch.object(CPUOffloadingSpec, "_uses_shared_region", return_value=True):
        return CPUOffloadingSpec(offloading)


def _keys(prefix: str, group_ids, chunks: int):
    from vllm.v1.kv_offload.base import make_offload_key

    return [
        make_offload_key(f"{prefix}:{c}".encode().ljust(16, b"."), g)
        for c in range(chunks)
        for g in group_ids
    ]


def _agreeing_digests(check, keys) -> dict[int, tuple[int, ...]]:
    """What every rank reports of a store job of ``keys`` whose ranks hold
    what the plan says: one digest per sampled chunk and shared class of its
    group on the rank's stage, all alike (the comparison's full work)."""
    from vllm.v1.kv_offload.cpu.replica_check import sampled_positions

    sampled = [keys[i] for i in sampled_positions(keys, check.rate)]
    reports = {}
    for stage, shared in enumerate(check.shared):
        count = sum(len(shared[check._group(key)]) for key in sampled)
        first = stage * check.regions * check.region_workers
        for rank in range(first, first + check.regions * check.region_workers):
            reports[rank] = (7,) * count
    return reports


def _manager_costs(spec, group_ids) -> dict[str, Any]:
    """The manager's work per request of REQUEST_CHUNKS chunks of every
    group, in steady state (the cache full, every store evicting): each step
    of a request that misses, stores, then loads its chunks."""
    from vllm.v1.kv_offload.base import ReqContext

    manager = spec.get_manager()
    ctx = ReqContext(req_id="perf")
    count = [0]
    check = getattr(manager, "_check", None)
    steps = ["lookup", "prepare_store", "complete_store"]
    if check is not None:
        steps.insert(2, "check_replicas")

    def request(timings: dict[str, list[float]] | None = None) -> None:
        count[0] += 1
        keys = _keys(f"r{count[0]}", group_ids, REQUEST_CHUNKS)
        digests = {} if check is None else _agreeing_digests(check, keys)
        for name, step in (
            ("lookup", lambda: [manager.lookup(key, ctx) for key in keys]),
            ("prepare_store", lambda: manager.prepare_store(keys, ctx)),
            # With the runtime check: the scheduler's comparison of every
            # rank's digests when the store job completes (ranks agree).
            ("check_replicas", lambda: manager.check_replicas(keys, digests)),
            ("complete_store", lambda: manager.complete_store(keys, ctx)),
            ("prepare_load", lambda: manager.prepare_load(keys, ctx)),
            ("complete_load", lambda: manager.complete_load(keys, ctx)),
        ):
            if name not in steps:
                continue
            start = time.perf_counter_ns()
            result = step()
            if timings is not None:
                timings[name].append((time.perf_counter_ns() - start) / 1e3)
            assert name != "prepare_store" or result is not None

    # Fill the cache: every request from then on evicts.
    while manager._get_num_free_chunks() >= REQUEST_CHUNKS * len(group_ids) * 4:
        request()
    for _ in range(4):
        request()
    steps += ["prepare_load", "complete_load"]
    timings: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(_repeats()):
        request(timings)
    out: dict[str, Any] = {name: statistics.median(t) for name, t in timings.items()}
    out["request_us"] = sum(out.values())
    out["request_calls"] = _counted(request)
    if check is not None:
        # The comparison of a job of the largest size: work per sampled chunk.
        from vllm.v1.kv_offload.cpu.replica_check import sampled_positions

        keys = _keys("job", group_ids, max(JOB_CHUNKS))
        assert manager.prepare_store(keys, ctx) is not None
        digests = _agreeing_digests(check, keys)
        out["job_check_us"] = _timed(lambda: manager.check_replicas(keys, digests))
        out["job_keys"] = len(keys)
        out["job_sampled"] = len(sampled_positions(keys, check.rate))
        manager.complete_store(keys, ctx)
    return out


def _round_costs(fn, finish, copies: list, jobs: int) -> dict[str, Any]:
    """The cost of ``fn`` (one job) over rounds of ``jobs`` consecutive job
    ids, a turn for each writer that shares a copy: the median over rounds of
    the mean and of the most expensive job, and per job the Python and C calls,
    copy descriptors and bytes of one round."""
    fn()
    finish()
    means, maxes = [], []
    for _ in range(_repeats()):
        samples = []
        for _ in range(jobs):
            start = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - start) / 1e3)
            finish()
        means.append(statistics.mean(samples))
        maxes.append(max(samples))
    copies.clear()
    calls = [0, 0]
    for _ in range(jobs):
        python, c = _counted(fn)
        calls[0] += python
        calls[1] += c
        finish()
    return {
        "us": statistics.median(means),
        "max_us": statistics.median(maxes),
        "calls": [calls[0] / jobs, calls[1] / jobs],
        "descriptors": sum(n for n, _ in copies) / jobs,
        "bytes": sum(b for _, b in copies) / jobs,
    }


def _worker_costs(
    config, configs, spec, rank: int, group_ids, layout: str, chunk_counts=JOB_CHUNKS
) -> dict[str, Any]:
    """The connector worker's submission and completion of store and load
    jobs of each of JOB_CHUNKS chunks of every group, on TP rank ``rank``."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,
        TransferJob,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )
    from vllm.v1.kv_offload.base import GPULoadStoreSpec, ReqContext
    from vllm.v1.kv_offload.cpu import gpu_worker
    from vllm.v1.kv_offload.cpu import spec as cpu_spec_module

    kv_cache_config = configs[rank]
    config.parallel_config.rank = rank
    tp = config.parallel_config.tensor_parallel_size
    bpc = spec.config.cache.blocks_per_chunk
    num_blocks = kv_cache_config.num_blocks
    assert num_blocks > max(JOB_CHUNKS) * bpc, num_blocks
    # The scheduler's manager hands out the units; the worker's own region
    # is small: its descriptors are address arithmetic, nothing is copied.
    row = _spec(config, kv_cache_config, {}).kv_bytes_per_chunk
    worker_spec = _spec(config, kv_cache_config, {"cpu_bytes_to_use": 2 * row})
    copies: list[tuple[int, int]] = []

    def swap(src, dst, sizes, **kwargs):
        copies.append((len(src), int(sizes.sum())))

    with (
        patch.object(gpu_worker, "current_platform", _PLATFORM),
        patch.object(torch, "Event", _Event),
        # Each simulated rank maps a region of its own, alone: no barrier
        # (nor, in the series, the start-up check of the region's members).
        patch.object(cpu_spec_module, "_all_workers_barrier", None),
        patch.object(type(worker_spec), "_uses_shared_region", return_value=True),
    ):
        connector = OffloadingConnectorWorker(worker_spec, config, kv_cache_config)
        with patch.object(
            cpu_spec_module.current_platform, "is_cuda_alike", return_value=True
        ):
            connector.register_kv_caches(_kv_caches(kv_cache_config, layout))
        worker = connector.worker
        for handler in (
            worker._store_handler,
            worker._load_handler,
            worker._expedited_load_handler,
        ):
            handler._swap_blocks_batch = swap
        manager = spec.get_manager()
        ctx = ReqContext(req_id="perf")
        out: dict[str, Any] = {}
        job = [0]
        try:
            for chunks in chunk_counts:
                keys = _keys(f"job{chunks}:{rank}", group_ids, chunks)
                prepared = manager.prepare_store(keys, ctx)
                assert prepared is not None, chunks
                manager.complete_store(keys, ctx)
                store_spec = prepared.store_spec
                load_spec = manager.prepare_load(keys, ctx)
                manager.complete_load(keys, ctx)
                blocks = [
                    b
                    for _ in group_ids
                    for b in np.random.default_rng(chunks)
                    .permutation(num_blocks)[: chunks * bpc]
                    .tolist()
                ]
                gpu_spec = GPULoadStoreSpec(
                    blocks,
                    tuple(chunks * bpc for _ in group_ids),
                    (0,) * len(group_ids),
                )

                def store(gpu_spec=gpu_spec, store_spec=store_spec):
                    job[0] += 1
                    meta = OffloadingConnectorMetadata(
                        load_jobs={},
                        store_jobs={job[0]: TransferJob("r", gpu_spec, store_spec)},
                    )
                    connector.prepare_store_kv(meta)
                    connector.start_kv_transfers(
                        OffloadingConnectorMetadata(load_jobs={}, store_jobs={})
                    )

                def load(gpu_spec=gpu_spec, load_spec=load_spec):
                    job[0] += 1
                    connector.start_kv_transfers(
                        OffloadingConnectorMetadata(
                            load_jobs={job[0]: TransferJob("r", load_spec, gpu_spec)},
                            store_jobs={},
                        )
                    )

                def finish():
                    connector.get_finished(set())
                    connector.build_connector_worker_meta()

                for name, fn in (("store", store), ("load", load)):
                    out[f"{name}_{chunks}"] = _round_costs(fn, finish, copies, tp)
        finally:
            worker.shutdown()
    return out


def measure(arch: architectures.Arch, check_rates: list[float]) -> dict[str, Any]:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        get_offloading_group_ids,
    )
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config

    tp, hosts = arch.usual_tp, arch.usual_hosts
    # The layout the connector asks for (layer-outermost), but for models
    # with state layers, whose backends need the block outermost.
    layout = (
        "LBHNC" if arch.model_dir is None and "mamba" not in arch.layers else "BLNHC"
    )
    # KV cache for a few blocks more than the largest job.
    _, configs = kv_tp_worker.plan(arch, tp, 1, layout=layout)
    block_bytes = configs[0].kv_cache_tensors[0].size // configs[0].num_blocks
    blocks = max(JOB_CHUNKS) + 16
    block_size, configs = kv_tp_worker.plan(
        arch, tp, 1, memory=blocks * block_bytes, layout=layout
    )
    scheduler = generate_scheduler_kv_cache_config(configs)
    group_ids = get_offloading_group_ids(scheduler)
    row: dict[str, Any] = {
        "arch": arch.name,
        "tp": tp,
        "hosts": hosts,
        "layout": layout,
    }
    for rate in [0.0, *check_rates]:
        extra: dict[str, Any] = {"verify_tp_replicas": rate} if rate else {}
        config = kv_tp_worker._offloading_vllm_config(
            arch, tp, 1, {"cpu_bytes_to_use": 1 << 40}, block_size, hosts
        )
        config.kv_transfer_config.engine_id = f"perf-{id(config)}"
        try:
            probe = _spec(config, scheduler, extra)
        except ValueError:  # a rate the tree refuses (no check)
            if rate:
                continue
            raise
        # Room for 8 of the largest jobs of chunks of every group.
        units = max(getattr(getattr(probe, "layout", None), "group_units", [1]))
        wanted = 8 * max(*JOB_CHUNKS, REQUEST_CHUNKS) * len(group_ids) * units
        extra["cpu_bytes_to_use"] = (1 << 40) * wanted // probe.num_chunks + 1
        spec = _spec(config, scheduler, extra)
        if rate and getattr(spec.get_manager(), "_check", None) is None:
            continue  # nothing shared: nothing to check
        key = f"check_{rate}" if rate else "plain"
        global _CHECKING
        _CHECKING = bool(rate)
        print(f"perf: {arch.name} TP {tp} {key}", file=sys.stderr, flush=True)
        row[key] = {
            "manager": _manager_costs(spec, group_ids),
            **{
                f"rank{rank}": _worker_costs(
                    config,
                    configs,
                    _spec(config, scheduler, dict(extra)),
                    rank,
                    group_ids,
                    layout,
                    # The digests run on the host here: the smaller jobs.
                    JOB_CHUNKS[:1] if rate else JOB_CHUNKS,
                )
                for rank in (0, 1)
            },
        }
    return row


def main() -> int:
    import argparse

    import vllm

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", action="append")
    parser.add_argument("--check", type=float, action="append", default=[])
    args = parser.parse_args()
    rows = []
    for arch in architectures.ARCHITECTURES:
        if args.model and not any(m in arch.name for m in args.model):
            continue
        try:
            rows.append(measure(arch, args.check))
        except AssertionError as e:  # the release's own asserts (see perf.py)
            rows.append({"arch": arch.name, "tp": arch.usual_tp, "error": str(e)})
    result = {"vllm": str(Path(vllm.__file__).parent.parent), "rows": rows}
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
