"""`make bench`: the trace replay (bench/trace_replay.py) against direct
simulations written here, on small traces and on the Mooncake trace itself,
its cost model (bench/costs.py), and `make bench` as a user runs it (each
tree's sizing, bench/sizing.py, run in the 0.34.0 release tree and in the
series tree)."""

from __future__ import annotations

import collections
import gzip
import json
import math
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))
import costs
import trace_replay
from trace_replay import BLOCK_TOKENS, NEVER, Request

import bench


def _write(path: Path, requests: list[dict]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    return path


def _random_trace(seed: int, n: int = 300, recent: int = 40) -> list[Request]:
    """Conversations that grow a prefix tree: each request extends an
    earlier one's prefix (one of the `recent` last, or a fresh root) by a
    few blocks, some with a partial last block."""
    rng = random.Random(seed)
    prefixes: list[tuple[int, ...]] = [()]
    requests = []
    next_id = 0
    for k in range(n):
        base = rng.choice(prefixes[-recent:])[: rng.randint(0, 6)]
        new = tuple(range(next_id, next_id + rng.randint(1, 4)))
        next_id += len(new)
        ids = base + new
        prefixes.append(ids)
        tail = rng.choice((0, 0, 100))
        length = (len(ids) - 1) * BLOCK_TOKENS + (tail or BLOCK_TOKENS)
        requests.append(Request(k * 0.5, length, rng.randint(1, 600), ids))
    return requests


def _direct_lru(requests: list[Request], gpu_blocks: int, host_blocks: int):
    """Hit tokens (GPU, host) of requests served one after the other,
    simulated directly: the GPU's cached blocks and the host's, each an LRU
    list, the host with `host_blocks` blocks."""
    gpu: collections.OrderedDict = collections.OrderedDict()
    host: collections.OrderedDict = collections.OrderedDict()
    gpu_hits = host_hits = 0
    for r in requests:
        ids = r.hash_ids[: r.full_blocks]
        k = 0
        while k < len(ids) and ids[k] in gpu:
            k += 1
        j = k
        while j < len(ids) and ids[j] in host:
            j += 1
        gpu_hits += k
        host_hits += j - k
        for i in ids[k:]:
            host.pop(i, None)
            host[i] = None
            while len(host) > host_blocks:
                host.popitem(last=False)
        own = -(-(r.input_length + r.output_length) // BLOCK_TOKENS) - len(ids)
        for i in ids:
            gpu.pop(i, None)
        while len(gpu) + len(set(ids)) + own > gpu_blocks:
            gpu.popitem(last=False)
        for i in reversed(ids):
            gpu[i] = None
    return gpu_hits * BLOCK_TOKENS, host_hits * BLOCK_TOKENS


@pytest.mark.parametrize("seed", range(4))
def test_one_pass_equals_a_direct_lru_at_every_size(seed):
    """The stack distances give, at every host size, the hits of an LRU
    host cache of that size simulated directly (requests one at a time:
    each ends before the next arrives)."""
    requests = _random_trace(seed)
    gpu_blocks = 12
    replay = trace_replay.replay(requests, gpu_blocks, lambda r, hits: 0.1)
    assert replay.too_long == 0 and replay.max_running == 1
    for host_blocks in (0, 1, 2, 5, 10, 20, 50, 100, 1000):
        gpu, host = _direct_lru(requests, gpu_blocks, host_blocks)
        assert (replay.gpu_hit_tokens, replay.host_hit_tokens(host_blocks)) == (
            gpu,
            host,
        ), host_blocks
    # Some hit on the host, more with more of it.
    assert 0 < replay.host_hit_tokens(50) < replay.host_hit_tokens(1000)
    # The smallest size that reaches a rate, and nothing smaller does.
    rate = replay.hit_rate(30)
    n = replay.host_blocks_to_reach(rate)
    assert n <= 30 and replay.hit_rate(n) >= rate > replay.hit_rate(n - 1)


def test_overlapping_requests_hold_their_blocks():
    """Running requests hold their blocks: one that does not fit beside
    them waits for one to end (first come, first served), blocks held by a
    running request are GPU hits of the next, and one longer than the whole
    cache is never admitted."""
    a = Request(0.0, 3 * BLOCK_TOKENS, 1, (1, 2, 3))
    b = Request(1.0, 2 * BLOCK_TOKENS, 1, (1, 2))
    c = Request(2.0, 3 * BLOCK_TOKENS, 1, (7, 8, 9))
    huge = Request(3.0, 9 * BLOCK_TOKENS, 1, tuple(range(10, 19)))
    replay = trace_replay.replay([a, b, c, huge], 8, lambda r, hits: 10.0)
    # a takes 4 blocks (3 and its answer's), b shares 2 of them and needs 1
    # for its answer, c needs 4 and waits for a to end at 10 s.
    assert [s.gpu_hit_blocks for s in replay.served] == [0, 2, 0]
    assert replay.max_running == 2
    assert replay.max_wait_s == pytest.approx(8.0)
    assert replay.too_long == 1


def test_the_series_never_serves_less_than_the_release():
    """Per request and at every size, on a trace whose working set fits the
    series' host cache but not the release's: the series' layout takes 4
    times fewer bytes a token (the same GPU cache), and it serves the whole
    ceiling where the release serves less."""
    requests = _random_trace(0, 600, recent=600)
    distinct = len({i for r in requests for i in r.hash_ids[: r.full_blocks]})
    sized = {}
    for label, per_chunk in ((bench.RELEASE, 4096), (bench.SERIES, 1024)):
        sized[label] = {
            "jobs": [
                {
                    "arch": "DeepSeek-V3 (MLA)",
                    "tp": 8,
                    "hosts": 1,
                    "gpu_tokens": 12 * BLOCK_TOKENS,
                    "rank_bytes_per_token": 1000.0,
                    "host_bytes_per_chunk": per_chunk,
                    "tokens_per_chunk": 1,
                }
            ]
        }
    (row,) = bench.measure(requests, sized)
    job = sized[bench.RELEASE]["jobs"][0]
    replay = trace_replay.replay(
        requests, 12, bench._run_seconds(costs.DEEPSEEK_V3, job)
    )
    # The same host memory: the whole working set in the series' layout.
    release_blocks, series_blocks = distinct // 4, distinct
    assert replay.hit_rate(series_blocks) == replay.hit_rate(NEVER)
    assert replay.hit_rate(release_blocks) < replay.hit_rate(series_blocks)
    for s in replay.served:
        assert s.host_hit_blocks(series_blocks) >= s.host_hit_blocks(release_blocks)
    for point in [*row["sweep"], row["typical"]]:
        assert point[bench.SERIES] >= point[bench.RELEASE]
    need = row["host_bytes_for_target"]
    assert need[bench.SERIES] * 4 == need[bench.RELEASE] > 0
    hours = row["prefill_gpu_hours_per_hour"]
    assert hours["no cache"] > hours[bench.RELEASE] >= hours[bench.SERIES]


def test_the_model_serves_as_vllms_scheduler_does(tmp_path):
    """The trace's first 600 requests, one after the other, through each
    tree's own Scheduler and OffloadingConnector (bench/sizing.py's serve)
    with a GPU cache of about 140,000 tokens and 16, 64 and 256 GiB of host
    memory, against the model with the sizes that tree gives: the same GPU
    hits request by request, and the same host hits but for the full chunks
    of a partial last block, which vLLM keeps and the model does not (at
    most a block a request, a tenth of a point in all)."""
    with gzip.open(bench.TRACE, "rt") as f:
        lines = [json.loads(next(f)) for _ in range(600)]
    requests = trace_replay.load(_write(tmp_path / "first.jsonl", lines))
    arch = "DeepSeek-V3 + EAGLE-3 draft (8 KV heads)"
    deployment = {"arch": arch, "tp": 8, "hosts": 1}
    sized = bench.run_trees({bench.RELEASE: [deployment], bench.SERIES: [deployment]})
    per_token = sized[bench.RELEASE]["jobs"][0]["rank_bytes_per_token"]
    job = {
        **deployment,
        "gpu_bytes": int(140_000 * per_token),
        "host_bytes": [16 << 30, 64 << 30, 256 << 30],
        "block_tokens": BLOCK_TOKENS,
        "requests": lines,
    }
    served = bench.run_trees({bench.RELEASE: [job], bench.SERIES: [job]})
    host_hits = {}
    for label in (bench.RELEASE, bench.SERIES):
        size = sized[label]["jobs"][0]
        block_bytes = (
            size["host_bytes_per_chunk"] * BLOCK_TOKENS / size["tokens_per_chunk"]
        )
        (real,) = served[label]["jobs"]
        replay = trace_replay.replay(
            requests, real["gpu_tokens"] // BLOCK_TOKENS, lambda r, hits: 0.0
        )
        for result in real["serve"]:
            host_blocks = int(result["host_bytes"] // block_bytes)
            for (gpu, host), s in zip(result["hits"], replay.served, strict=True):
                assert gpu == s.gpu_hit_blocks * BLOCK_TOKENS
                model = s.host_hit_blocks(host_blocks) * BLOCK_TOKENS
                assert model <= host < model + BLOCK_TOKENS
            real_rate = sum(h for _, h in result["hits"]) / replay.prompt_tokens
            model_rate = replay.host_hit_tokens(host_blocks) / replay.prompt_tokens
            assert real_rate - model_rate < 0.001
            host_hits[label, result["host_bytes"]] = real_rate
    # vLLM's own scheduler: the series serves more from the same memory.
    assert (
        host_hits[bench.SERIES, 256 << 30] > 0.1 > host_hits[bench.RELEASE, 256 << 30]
    )


def test_the_mooncake_trace_as_its_readme_states():
    """The project's copy of the trace: its facts (bench/traces/README.md),
    and its ceiling, computed here directly, is the replay's with a host
    cache that never evicts (whatever the GPU cache)."""
    requests = trace_replay.load(bench.TRACE)
    assert len(requests) == 12_031
    assert sum(r.input_length for r in requests) == 144_793_823
    assert len({i for r in requests for i in r.hash_ids}) == 182_790
    seen: set[int] = set()
    hit_blocks = blocks = hit_tokens = 0
    for r in requests:
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[k] in seen:
            k += 1
        hit_blocks += k
        blocks += len(r.hash_ids)
        hit_tokens += min(k, r.full_blocks) * BLOCK_TOKENS
        seen.update(r.hash_ids[: r.full_blocks])
    assert f"{hit_blocks / blocks:.1%}" == "36.6%"
    replay = trace_replay.replay(requests, 2000, lambda r, hits: 5.0)
    assert replay.prompt_tokens == 144_793_823
    assert replay.hit_rate(NEVER) == hit_tokens / replay.prompt_tokens
    assert replay.hit_rate(0) < 0.1


def test_a_trace_not_in_the_format_is_named(tmp_path):
    good = {"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [4, 9]}
    plain = _write(tmp_path / "t.jsonl", [good, {**good, "timestamp": 1}])
    gzipped = _write(tmp_path / "t.jsonl.gz", [good])
    assert [r.arrival_s for r in trace_replay.load(plain)] == [0.001, 0.005]
    assert trace_replay.load(gzipped)[0].hash_ids == (4, 9)
    short = _write(tmp_path / "short.jsonl", [good, {**good, "hash_ids": [4]}])
    with pytest.raises(trace_replay.TraceError, match=r"short.jsonl:2: input_length"):
        trace_replay.load(short)
    missing = _write(tmp_path / "missing.jsonl", [{"timestamp": 1}])
    with pytest.raises(trace_replay.TraceError, match=r"missing.jsonl:1: .*hash_ids"):
        trace_replay.load(missing)


def test_costs():
    c = costs.DEEPSEEK_V32
    # The windowed attention sum in closed form, against the sum itself.
    for cached, computed in ((0, 5000), (1000, 3000), (3000, 10), (2047, 2)):
        brute = sum(min(c.attention_window, cached + i) for i in range(computed))
        full = costs.Compute("x", 1, 0, 0, 1.0, c.attention_window)
        weights = math.ceil(computed / costs.MAX_NUM_BATCHED_TOKENS) * 0
        assert costs.prefill_seconds(full, 1, cached, computed) == pytest.approx(
            brute / costs.H200_BF16_FLOP_PER_S + weights
        )
    v3 = costs.DEEPSEEK_V3
    # Cached tokens make a prefill cheaper: its FLOPs, and its time.
    assert costs.prefill_flops(v3, 4000, 1000) < costs.prefill_flops(v3, 0, 5000)
    assert costs.prefill_seconds(v3, 8, 4000, 1000) < costs.prefill_seconds(
        v3, 8, 0, 5000
    )
    assert costs.prefill_flops(v3, 0, 1) == 2 * v3.active_params
    assert costs.gpu_kv_bytes(v3, 8) == pytest.approx(141e9 * 0.9 - 671e9 / 8)
    for name in costs.COMPUTE:
        assert any(a.name == name for a in bench.architectures.ARCHITECTURES)


def test_make_bench_as_a_user_runs_it(tmp_path):
    """`make bench` on a trace file of the same format (the Mooncake trace's
    first 400 requests), for one deployment: the JSON alone on stdout, its
    ceiling and GPU hits as a replay here gives them with the GPU cache the
    trees size, the series at least the release at every host size, and a
    plot that shows those numbers; a file not in the format is named."""
    from PIL import Image
    from test_demo import make

    with gzip.open(bench.TRACE, "rt") as f:
        lines = [json.loads(next(f)) for _ in range(400)]
    small = _write(tmp_path / "small.jsonl", lines)
    arch = "DeepSeek-V3 + EAGLE-3 draft (8 KV heads)"
    png = tmp_path / "bench.png"
    out = json.loads(
        make("bench", f"ARGS=--model '{arch}' --trace {small} --json --plot {png}")
    )
    (row,) = out["rows"]
    assert (row["arch"], row["tp"], row["hosts"]) == (arch, 8, 1)
    requests = trace_replay.load(small)
    replay = trace_replay.replay(
        requests,
        row["gpu_tokens"] // BLOCK_TOKENS,
        bench._run_seconds(costs.COMPUTE[arch], row),
    )
    assert row["requests"] == 400 and row["too_long"] == 0
    assert row["prompt_tokens"] == replay.prompt_tokens
    assert row["ceiling"] == replay.hit_rate(NEVER)
    assert row["gpu_hit_rate"] == replay.hit_rate(0)
    per_token = row["host_bytes_per_token"]
    # The draft's 8 KV heads: one copy per rank in the release, shared by
    # the series (the demo's figures, host bytes a token).
    assert per_token[bench.RELEASE] > 4 * per_token[bench.SERIES]
    assert len(row["sweep"]) == len(bench.SWEEP) >= 8
    for point in row["sweep"]:
        assert row["ceiling"] >= point[bench.SERIES] >= point[bench.RELEASE]
    drawn = json.loads(Image.open(png).info["Description"])
    for label in (bench.RELEASE, bench.SERIES):
        assert drawn[f"{arch}|{label}"] == [p[label] for p in row["sweep"]]
    bad = _write(tmp_path / "bad.jsonl", [{"timestamp": 1}])
    with pytest.raises(AssertionError, match=r"bad.jsonl:1: not a request"):
        make("bench", f"ARGS=--trace {bad}")
