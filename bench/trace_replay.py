"""The replay of `make bench`: a request trace in the Mooncake trace format,
replayed whole through a model of vLLM's two KV caches, the GPU prefix cache
and the offloading connector's host cache, at every host size in one pass.

Pure Python (no vLLM). What a tree gives a deployment (the tokens of its GPU
cache, the host bytes a token takes) is measured in the tree itself
(bench/sizing.py); this file models what happens to the trace's blocks.

What is modelled:
- Blocks are the trace's: two requests share a block iff they share its
  hash id and every one before it. Only full blocks are cached (vLLM and the
  connector keep full blocks only; at the trace's granularity a partial last
  block is one), so a partial last block is always computed.
- Requests arrive at their timestamps and are admitted first come, first
  served when the GPU KV cache has room for the whole request (prompt and
  answer, as vLLM allocates them). Running requests hold their blocks;
  cached blocks nobody holds are evicted least recently used first, a
  request's last block first (vLLM's free block queue).
- A prompt's leading blocks cached on the GPU are GPU hits. The connector
  looks the following ones up in host memory: those there, up to the first
  miss, are host hits (loaded), the rest are computed. Every prompt block
  past the GPU hits is then the most recently used block of the host cache
  (loaded blocks are touched, computed ones stored). The host cache is one
  LRU cache (vLLM's default policy) of as many blocks as the host memory
  holds in the tree's layout.
- Time: a request's prefill runs at peak FLOP/s on the tokens the GPU did
  not hold, then it decodes `output_length` tokens, each step one read of
  the weights and of its KV (bench/costs.py: batch 1, a lower bound of how
  long it holds its blocks). Its answer's tokens are its own: its blocks
  are held while it runs and dropped after (the next turn's hash ids say
  what it shares); the connector stores prompts only (its default,
  `offload_prompt_only`).

Host hits do not change when a request runs, so the GPU cache, and with it
the sequence of blocks the host cache sees, is the same at every host size.
One pass then gives the hits of every size (Mattson et al., "Evaluation
techniques for storage hierarchies", IBM Systems Journal, 1970): an LRU
cache of C blocks holds a block iff fewer than C other blocks were used
since its last use, its stack distance. A host hit needs every block before
it in the request to be held too, so a block is a hit at sizes above the
largest stack distance up to it in its request.
"""

from __future__ import annotations

import bisect
import collections
import gzip
import heapq
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# The Mooncake trace's block of tokens (its README: "hash_ids" are the
# hashes of 512-token blocks).
BLOCK_TOKENS = 512
# The stack distance of a block never used before: no cache holds it.
NEVER = math.inf


class TraceError(ValueError):
    """A trace file that is not in the Mooncake trace format."""


@dataclass(frozen=True)
class Request:
    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @property
    def full_blocks(self) -> int:
        return self.input_length // BLOCK_TOKENS


def load(path: Path) -> list[Request]:
    """The requests of a trace file (JSON lines, gzipped or not: timestamp
    in ms, input_length, output_length, hash_ids of 512-token blocks), in
    order of arrival."""
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    requests = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                request = Request(
                    float(r["timestamp"]) / 1000,
                    int(r["input_length"]),
                    int(r["output_length"]),
                    tuple(int(h) for h in r["hash_ids"]),
                )
            except (ValueError, KeyError, TypeError) as e:
                raise TraceError(
                    f"{path}:{n}: not a request of the Mooncake trace format "
                    f"({type(e).__name__}: {e}); each line is a JSON object with "
                    '"timestamp" (ms), "input_length", "output_length" and '
                    '"hash_ids" (one id per 512-token block of the prompt)'
                ) from None
            blocks = -(-request.input_length // BLOCK_TOKENS)
            if request.input_length < 1 or len(request.hash_ids) != blocks:
                raise TraceError(
                    f"{path}:{n}: input_length {request.input_length} needs "
                    f"{blocks} hash_ids (one per {BLOCK_TOKENS}-token block, "
                    f"the last may be partial), not {len(request.hash_ids)}"
                )
            requests.append(request)
    if not requests:
        raise TraceError(f"{path}: no requests")
    requests.sort(key=lambda r: r.arrival_s)
    return requests


class _StackDistances:
    """LRU stack distances of a sequence of block uses, in O(log n) a use: a
    Fenwick tree marks each block's last use."""

    def __init__(self, uses: int) -> None:
        self._tree = [0] * (uses + 1)
        self._last: dict[int, int] = {}
        self._now = 0

    def _add(self, i: int, delta: int) -> None:
        i += 1
        while i < len(self._tree):
            self._tree[i] += delta
            i += i & -i

    def _before(self, i: int) -> int:
        """Marks at positions below i."""
        total = 0
        while i > 0:
            total += self._tree[i]
            i -= i & -i
        return total

    def use(self, block: int) -> float:
        """The block's stack distance: the other blocks used since its last
        use (NEVER if it has none)."""
        now = self._now
        self._now += 1
        last = self._last.get(block)
        distance: float = NEVER
        if last is not None:
            distance = self._before(now) - self._before(last + 1)
            self._add(last, -1)
        self._add(now, 1)
        self._last[block] = now
        return distance


@dataclass
class Served:
    """A request as served: its prompt, its GPU hits, and for each block
    after them, the host size (in blocks) above which it is a host hit."""

    prompt_tokens: int
    gpu_hit_blocks: int
    host_needs: list[float]

    def host_hit_blocks(self, host_blocks: float) -> int:
        # host_needs is nondecreasing (a running maximum).
        return bisect.bisect_left(self.host_needs, host_blocks)


@dataclass
class Replay:
    """The trace as one deployment serves it, at every host size."""

    served: list[Served]
    # Requests longer than the whole GPU cache (never admitted).
    too_long: int = 0
    # The GPU blocks and the longest wait for room, for the record.
    gpu_blocks: int = 0
    max_wait_s: float = 0.0
    max_running: int = 0
    _curve: tuple[list[float], list[int]] | None = field(default=None, repr=False)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.served)

    @property
    def gpu_hit_tokens(self) -> int:
        return BLOCK_TOKENS * sum(s.gpu_hit_blocks for s in self.served)

    def host_hit_tokens(self, host_blocks: float) -> int:
        """Prompt tokens loaded from a host cache of `host_blocks` blocks."""
        if self._curve is None:
            needs = collections.Counter(
                n for s in self.served for n in s.host_needs if n < NEVER
            )
            sizes = sorted(needs)
            cumulative = []
            total = 0
            for size in sizes:
                total += needs[size]
                cumulative.append(total)
            self._curve = (sizes, cumulative)
        sizes, cumulative = self._curve
        i = bisect.bisect_left(sizes, host_blocks)
        return BLOCK_TOKENS * (cumulative[i - 1] if i else 0)

    def host_blocks_to_reach(self, rate: float) -> int:
        """The smallest host cache (in blocks) that serves `rate` of the
        prompt tokens from cache, GPU hits included."""
        missing = rate * self.prompt_tokens - self.gpu_hit_tokens
        if missing <= 0:
            return 0
        self.host_hit_tokens(0)  # the curve
        assert self._curve is not None
        sizes, cumulative = self._curve
        i = bisect.bisect_left(cumulative, math.ceil(missing / BLOCK_TOKENS))
        if i == len(sizes):
            raise ValueError(f"no host cache serves {rate:.1%} of the prompt")
        return int(sizes[i]) + 1

    def hit_rate(self, host_blocks: float) -> float:
        """The share of prompt tokens served from cache (GPU and host)."""
        hits = self.gpu_hit_tokens + self.host_hit_tokens(host_blocks)
        return hits / self.prompt_tokens


def replay(
    requests: list[Request],
    gpu_blocks: int,
    seconds: Callable[[Request, int], float],
) -> Replay:
    """The trace through a GPU prefix cache of `gpu_blocks` blocks; a
    request runs for `seconds(request, gpu_hit_blocks)` once admitted."""
    uses = sum(r.full_blocks for r in requests)
    distances = _StackDistances(uses)
    # Blocks held by running requests (how many hold each), and the cached
    # blocks nobody holds, least recently used first.
    held: dict[int, int] = {}
    cached: collections.OrderedDict[int, None] = collections.OrderedDict()
    # Blocks of running requests that no one else can hit (partial last
    # blocks, answers).
    private = 0
    waiting: collections.deque[tuple[int, Request]] = collections.deque()
    running: list[tuple[float, int, Request, int]] = []
    result = Replay(served=[], gpu_blocks=gpu_blocks)

    def admit(now: float) -> None:
        nonlocal private
        while waiting:
            index, r = waiting[0]
            ids = r.hash_ids[: r.full_blocks]
            own = -(-(r.input_length + r.output_length) // BLOCK_TOKENS) - len(ids)
            present = {i for i in ids if i in held or i in cached}
            missing = len(set(ids) - present)
            if missing + own + len(present) > gpu_blocks:
                waiting.popleft()
                result.too_long += 1
                continue
            reused = sum(1 for i in present if i in cached)
            room = gpu_blocks - len(held) - private - reused
            if missing + own > room:
                return  # first come, first served: wait for a request to end
            waiting.popleft()
            result.max_wait_s = max(result.max_wait_s, now - r.arrival_s)
            hits = 0
            while hits < len(ids) and ids[hits] in present:
                hits += 1
            for i in present:
                cached.pop(i, None)
                held[i] = held.get(i, 0) + 1
            # Evict what the new blocks need beyond the free ones.
            free = gpu_blocks - len(held) - private - len(cached)
            for _ in range(missing + own - free):
                cached.popitem(last=False)
            for i in set(ids) - present:
                held[i] = 1
            private += own
            need = 0.0
            host_needs = []
            for i in ids[hits:]:
                need = max(need, distances.use(i))
                host_needs.append(need)
            result.served.append(Served(r.input_length, hits, host_needs))
            end = now + seconds(r, hits)
            heapq.heappush(running, (end, index, r, own))
            result.max_running = max(result.max_running, len(running))

    def finish() -> float:
        nonlocal private
        end, _, r, own = heapq.heappop(running)
        private -= own
        # The last block first in line for eviction.
        for i in reversed(dict.fromkeys(r.hash_ids[: r.full_blocks])):
            held[i] -= 1
            if not held[i]:
                del held[i]
                cached[i] = None
        return end

    for index, r in enumerate(requests):
        while running and running[0][0] <= r.arrival_s:
            admit(finish())
        waiting.append((index, r))
        admit(r.arrival_s)
    while running or waiting:
        admit(finish())
    return result
