"""`make bench`: the replay through each tree's real scheduler
(bench/replay.py) on small traces whose outcome is computed here
independently, and the pure parts (bench/workloads.py, bench/costs.py).

The replays run in the 0.34.0 release tree and the series tree at once (a
process each), one batch of jobs per tree for the whole module."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))
import costs
import workloads

import bench

# A deployment whose series keeps half the release's host copies: 4 KV
# heads on 8 ranks, each head on 2 (the demo: 2,752 -> 5,568 tokens/GiB).
ARCH, TP = "Qwen3-235B-like (GQA, 4 KV heads)", 8
BLOCK = 64
PREFIX = 200
# A rank's KV of one token: 94 layers, K and V of one 128-wide bf16 head.
RANK_BYTES_PER_TOKEN = 94 * 2 * 128 * 2
UNBOUNDED = 1 << 50


def _sessions(n: int, turns: list[tuple[int, int]], gap: float) -> list[dict]:
    """n sessions of `turns` (new tokens, answer tokens; a little more in
    some), session i starting at i s, on prefix i % 2, each turn `gap` s
    after the last (far more than any TTFT or answer here, so the requests
    come turn by turn, session by session)."""
    return [
        {
            "start_s": float(i),
            "prefix": i % 2,
            "turns": [
                [0.0 if k == 0 else gap, new + 17 * ((i + k) % 3), answer + i]
                for k, (new, answer) in enumerate(turns)
            ],
        }
        for i in range(n)
    ]


def _prompts(trace: list[dict]) -> list[tuple[int, int, int]]:
    """(session, turn, prompt length) of each request, in arrival order."""
    out = []
    for i, s in enumerate(trace):
        context = PREFIX
        for k, (_, new, answer) in enumerate(s["turns"]):
            context += new
            out.append((i, k, context))
            context += answer
    # Turn by turn, then by start (see _sessions).
    return sorted(out, key=lambda r: (r[1], r[0]))


def expected_hits(trace: list[dict]) -> dict[tuple[int, int], int]:
    """The prompt tokens a cache that never forgets serves each request:
    the full blocks of its prompt some earlier request's prompt held (its
    own session's earlier turns hold theirs, any session on the same prefix
    the prefix's full blocks), short of its last token, which vLLM always
    computes."""
    seen: dict[tuple[int, int], int] = {}  # (prefix, session) -> blocks
    prefix_seen: set[int] = set()
    hits = {}
    for i, k, length in _prompts(trace):
        prefix = trace[i]["prefix"]
        blocks = seen.get((prefix, i), 0)
        if prefix in prefix_seen:
            blocks = max(blocks, PREFIX // BLOCK)
        hits[i, k] = BLOCK * min(blocks, (length - 1) // BLOCK)
        seen[prefix, i] = max(seen.get((prefix, i), 0), length // BLOCK)
        prefix_seen.add(prefix)
    return hits


# Trace "repeat": 6 sessions of 3 turns; the GPU cache (32 blocks) cannot
# keep a session's blocks from one of its turns to the next, so the host
# serves most of its hits.
REPEAT = _sessions(6, [(300, 80)] * 3, 100.0)
# Trace "fit": 10 sessions of 2 turns, which store about 76 chunks in all:
# they fit the series' 90 chunks of host memory, not the release's 45 (the
# first turns alone store 56).
FIT = _sessions(10, [(320, 90), (50, 10)], 100.0)
GPU_BYTES = 32 * BLOCK * RANK_BYTES_PER_TOKEN
# The release's row: the 8 ranks' blocks of a chunk, one each (the demo:
# 2,752 tokens per GiB); the series keeps 4 copies (one per pair of ranks).
RELEASE_CHUNK_BYTES = TP * BLOCK * RANK_BYTES_PER_TOKEN
FIT_HOST_BYTES = 45 * RELEASE_CHUNK_BYTES + 4096


# DeepSeek-V3's MLA latent: 61 layers of 576 bf16 a token, the same on every
# rank, which the release already keeps once on the host (as the series).
MLA_ARCH = "DeepSeek-V3 (MLA)"
MLA_CHUNK_BYTES = 61 * 576 * 2 * BLOCK


def _job(name, trace, caches, arch=ARCH, gpu_bytes=GPU_BYTES):
    return {
        "name": name,
        "arch": arch,
        "tp": TP,
        "trace": trace,
        "prefix_tokens": PREFIX,
        "gpu_bytes": gpu_bytes,
        "warmup_s": 0.0,
        "records": True,
        "caches": caches,
    }


JOBS = [
    _job(
        "repeat",
        REPEAT,
        [
            {"host_bytes": UNBOUNDED, "policy": "lru"},
            {"host_bytes": UNBOUNDED, "policy": "arc"},
            {"chunks": 1, "policy": "lru"},
        ],
    ),
    _job(
        "fit",
        FIT,
        [
            {"host_bytes": UNBOUNDED, "policy": "lru"},
            {"host_bytes": FIT_HOST_BYTES, "policy": "lru"},
        ],
    ),
    _job(
        "mla",
        FIT,
        [{"host_bytes": 100 * MLA_CHUNK_BYTES + 4096, "policy": "lru"}],
        arch=MLA_ARCH,
        gpu_bytes=32 * MLA_CHUNK_BYTES,
    ),
]


@pytest.fixture(scope="module")
def replays() -> dict[str, dict[str, dict]]:
    """{tree: {job name: job result}}: both trees at once, as `make bench`
    runs them."""
    results = bench.run_trees({bench.RELEASE: JOBS, bench.SERIES: JOBS})
    return {
        label: {job["name"]: job for job in data["jobs"]}
        for label, data in results.items()
    }


def _by_request(result: dict) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(session, turn) -> (prompt, GPU hits, host hits)."""
    return {(r[0], r[1]): (r[2], r[3], r[4]) for r in result["records"]}


@pytest.mark.parametrize("tree", [bench.RELEASE, bench.SERIES])
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_unbounded_cache_hits_every_repeated_block(replays, tree, policy):
    (result,) = [
        r
        for r in replays[tree]["repeat"]["results"]
        if r.get("host_bytes") == UNBOUNDED and r["policy"] == policy
    ]
    got = _by_request(result)
    expected = expected_hits(REPEAT)
    assert set(got) == set(expected)
    for key, hits in expected.items():
        prompt, gpu, host = got[key]
        assert prompt == {(i, k): n for i, k, n in _prompts(REPEAT)}[key]
        assert gpu + host == hits, (key, got[key], hits)
    # The GPU cache cannot hold a session's blocks from one turn to the
    # next: the host serves them.
    assert sum(h for _, _, h in got.values()) > sum(expected.values()) / 2


@pytest.mark.parametrize("tree", [bench.RELEASE, bench.SERIES])
def test_one_chunk_cache_serves_nothing_across_requests(replays, tree):
    (one,) = [r for r in replays[tree]["repeat"]["results"] if r.get("chunks") == 1]
    assert one["host_chunks"] >= 1
    # A hit is a prefix of the prompt: the chunk left by the previous
    # request (its last full block) is no request's first block.
    assert one["host_hit_tokens"] == 0
    (unbounded,) = [
        r
        for r in replays[tree]["repeat"]["results"]
        if r.get("host_bytes") == UNBOUNDED and r["policy"] == "lru"
    ]
    # What the GPU serves is the GPU's alone: the same either way.
    assert one["gpu_hit_tokens"] == unbounded["gpu_hit_tokens"]


def test_series_holds_what_the_release_cannot(replays):
    """At equal host memory (45 of the release's chunks), the series holds
    twice the chunks: the trace's working set fits it, not the release."""
    release, series = (
        {r["host_bytes"]: r for r in replays[tree]["fit"]["results"]}
        for tree in (bench.RELEASE, bench.SERIES)
    )
    release[45], series[45] = release[FIT_HOST_BYTES], series[FIT_HOST_BYTES]
    release["unbounded"] = release[UNBOUNDED]
    assert (release[45]["host_chunks"], series[45]["host_chunks"]) == (45, 90)
    expected = sum(expected_hits(FIT).values())
    assert (
        release["unbounded"]["gpu_hit_tokens"] + release["unbounded"]["host_hit_tokens"]
        == expected
    )
    # The series serves all a cache that never forgets serves; the release
    # loses some, and never does better on any request.
    assert series[45]["gpu_hit_tokens"] + series[45]["host_hit_tokens"] == expected
    assert release[45]["gpu_hit_tokens"] + release[45]["host_hit_tokens"] < expected
    rel, ser = _by_request(release[45]), _by_request(series[45])
    for key in rel:
        assert sum(ser[key][1:]) >= sum(rel[key][1:]), key
    # Fewer computed tokens make the series' TTFT no worse anywhere.
    assert series[45]["ttft_p90_s"] <= release[45]["ttft_p90_s"]


def test_each_tree_sizes_the_host_as_it_serves(replays):
    """The replay's scheduler sizes the host as each tree's engine does: an
    MLA model's latent once per chunk in the release too (its single-copy
    layout, which it gates on the model config's use_mla)."""
    for tree in (bench.RELEASE, bench.SERIES):
        (result,) = replays[tree]["mla"]["results"]
        assert result["host_chunks"] == 100, (tree, result["host_chunks"])


def test_workloads_are_deterministic_and_follow_their_sources():
    chat = workloads.WORKLOADS["chat"]
    a = workloads.generate(chat, 2.0, 3000.0, seed=1)
    assert a == workloads.generate(chat, 2.0, 3000.0, seed=1)
    assert a != workloads.generate(chat, 2.0, 3000.0, seed=2)
    turns = [t for s in a for t in s.turns]
    # LMSYS-Chat-1M's means: 2.0 turns, 69.5 prompt and 214.5 answer tokens.
    assert len(turns) / len(a) == pytest.approx(2.0, rel=0.05)
    assert sum(t.new_tokens for t in turns) / len(turns) == pytest.approx(69.5, rel=0.1)
    assert sum(t.answer_tokens for t in turns) / len(turns) == pytest.approx(
        214.5, rel=0.1
    )
    for shape in workloads.WORKLOADS.values():
        for s in workloads.generate(shape, 1.0, 2000.0, seed=0):
            assert (
                shape.prefix_tokens + s.distinct_tokens - s.turns[-1].answer_tokens
                <= shape.max_context
            )


def test_costs():
    assert costs.PCIE5_X16_BYTES_PER_S == pytest.approx(63.0e9, rel=0.001)
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
    # Cached tokens make a prefill cheaper; loading them over PCIe is
    # cheaper still than computing them.
    assert costs.prefill_seconds(v3, 8, 4000, 1000) < costs.prefill_seconds(
        v3, 8, 0, 5000
    )
    per_token = 61 * 1152
    assert costs.load_seconds(4000 * per_token) < costs.prefill_seconds(
        v3, 8, 0, 5000
    ) - costs.prefill_seconds(v3, 8, 4000, 1000)
    assert costs.gpu_kv_bytes(v3, 8) == pytest.approx(141e9 * 0.9 - 671e9 / 8)
    for name in costs.COMPUTE:
        assert any(a.name == name for a in bench.architectures.ARCHITECTURES)


def test_make_bench_as_a_user_runs_it(tmp_path):
    """`make bench` for one deployment and workload, small: the JSON alone
    on stdout, every size of both trees and the ceiling, and a plot that
    shows those numbers."""
    from PIL import Image
    from test_demo import make

    png = tmp_path / "bench.png"
    rows = json.loads(
        make(
            "bench",
            f"ARGS=--model '{ARCH}' --workload chat --tokens 300000 --json "
            f"--plot {png}",
        )
    )["rows"]
    assert [(r["arch"], r["tp"], r["workload"]) for r in rows] == [(ARCH, TP, "chat")]
    (row,) = rows
    # Its usual shape: hosts of 8 GPUs.
    assert row["hosts"] == max(1, TP // 8)
    ceiling = row["unbounded"]
    for size in bench.HOST_SIZES:
        release = row[bench.RELEASE][f"lru@{size}"]
        series = row[bench.SERIES][f"lru@{size}"]
        for r in (release, series):
            assert r["requests"] > 100
            assert r["prompt_tokens"] == ceiling["prompt_tokens"]
            assert (
                r["gpu_hit_tokens"] + r["host_hit_tokens"] + r["computed_tokens"]
                == r["prompt_tokens"]
            )
        # Twice the chunks in the same memory.
        assert series["host_chunks"] == pytest.approx(2 * release["host_chunks"], abs=2)
        hits = [bench._hits(r) for r in (release, series, ceiling)]
        assert hits[0] <= hits[1] <= hits[2]
    drawn = json.loads(Image.open(png).info["Description"])
    for label in (bench.RELEASE, bench.SERIES):
        assert drawn[f"{ARCH}|chat|{label}"] == [
            bench._hits(row[label][f"lru@{size}"]) for size in bench.HOST_SIZES
        ]
