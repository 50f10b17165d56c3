"""The request traces of `make bench` (bench/bench.py): sessions of turns,
generated from the statistics named below, deterministic by seed.

A session starts with a shared prefix (a system or tool prompt, one of a
few that every session of an application shares), then takes turns: each
turn's prompt is the whole conversation so far plus the turn's new tokens
(a user message or a tool's output); its answer is appended to the
conversation before the next turn, which arrives a think time after the
answer. Pure Python (no vLLM): the driver, the tree-side replay and the
tests share it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """A workload's statistics (see WORKLOADS for where each comes from).

    Lengths are in tokens, times in seconds; a "lognormal" figure is its
    median and the sigma of its log. Turns per session: 1 + a geometric
    count with mean `mean_turns - 1`, capped at `max_turns`.
    """

    name: str
    description: str
    prefixes: int
    prefix_tokens: int
    first_tokens: float
    turn_tokens: tuple[float, float]
    answer_tokens: tuple[float, float]
    mean_turns: float
    max_turns: int
    think_s: tuple[float, float]
    sources: str
    # A session ends before a turn whose prompt would pass this (a model of
    # 128K tokens of context).
    max_context: int = 131072 - 4096


WORKLOADS = {
    "chat": Shape(
        name="chat",
        description="multi-turn chat",
        prefixes=16,
        prefix_tokens=1000,
        first_tokens=69.5,
        # LMSYS-Chat-1M (Zheng et al., ICLR 2024, Table 1): 2.0 turns per
        # conversation, 69.5 tokens per user prompt and 214.5 per response,
        # on average; lognormal lengths with those means (sigma chosen).
        turn_tokens=(69.5 / math.exp(0.5), 1.0),
        answer_tokens=(214.5 / math.exp(0.32), 0.8),
        mean_turns=2.0,
        max_turns=32,
        # Chosen, not measured: a user reads and types for a minute (median),
        # often much longer.
        think_s=(60.0, 1.5),
        sources=(
            "turns, prompt and answer lengths: LMSYS-Chat-1M (Zheng et al., "
            "ICLR 2024); 16 system prompts of 1,000 tokens and think times "
            "(median 60 s) chosen"
        ),
    ),
    "agent": Shape(
        name="agent",
        description="agentic sessions",
        # Chosen, not measured: 4 agents, each with a 6,000-token system and
        # tool prompt; a 300-token task; 12 turns per session on average (at
        # most 50, and a context of at most 64K tokens), each a 120-token
        # action (median) answered by a 600-token tool output (median, heavy
        # tail) after 2 s (median).
        prefixes=4,
        prefix_tokens=6000,
        first_tokens=300,
        turn_tokens=(600.0, 1.0),
        answer_tokens=(120.0, 0.6),
        mean_turns=12.0,
        max_turns=50,
        think_s=(2.0, 1.0),
        sources=(
            "chosen: 4 agents with 6,000-token tool prompts, 12 turns per "
            "session on average, tool outputs of 600 tokens (median) after 2 s"
        ),
        max_context=65536 - 4096,
    ),
}


@dataclass(frozen=True)
class Turn:
    """One request of a session: `think_s` after the previous answer (0 for
    the first), `new_tokens` appended to the conversation, then an answer of
    `answer_tokens` tokens."""

    think_s: float
    new_tokens: int
    answer_tokens: int


@dataclass(frozen=True)
class Session:
    start_s: float
    prefix: int
    turns: tuple[Turn, ...]

    @property
    def distinct_tokens(self) -> int:
        """The tokens of its own (the shared prefix excluded)."""
        return sum(t.new_tokens + t.answer_tokens for t in self.turns)

    def longest_prompt(self, prefix_tokens: int) -> int:
        """Its last turn's prompt: the prefix and every token but the last
        answer."""
        return prefix_tokens + self.distinct_tokens - self.turns[-1].answer_tokens

    def prompt_tokens(self, prefix_tokens: int) -> int:
        """The prompt tokens of all its turns together."""
        total, context = 0, prefix_tokens
        for turn in self.turns:
            context += turn.new_tokens
            total += context
            context += turn.answer_tokens
        return total


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def _turns(rng: random.Random, shape: Shape) -> int:
    # 1 + geometric (failures before a success) with mean mean_turns - 1.
    p = 1.0 / shape.mean_turns
    turns = 1
    while turns < shape.max_turns and rng.random() > p:
        turns += 1
    return turns


def generate(
    shape: Shape, sessions_per_s: float, span_s: float, seed: int
) -> list[Session]:
    """The sessions that start in [0, span_s), as a Poisson process of
    `sessions_per_s`, each prefix chosen with Zipf (1/rank) popularity."""
    rng = random.Random(f"{shape.name}:{seed}")
    weights = [1.0 / (rank + 1) for rank in range(shape.prefixes)]
    sessions = []
    t = rng.expovariate(sessions_per_s)
    while t < span_s:
        turns: list[Turn] = []
        context = shape.prefix_tokens
        for i in range(_turns(rng, shape)):
            new = (
                shape.first_tokens * math.exp(rng.gauss(0.0, 1.0) - 0.5)
                if i == 0
                else _lognormal(rng, *shape.turn_tokens)
            )
            turn = Turn(
                think_s=0.0 if i == 0 else _lognormal(rng, *shape.think_s),
                new_tokens=max(1, round(new)),
                answer_tokens=max(1, round(_lognormal(rng, *shape.answer_tokens))),
            )
            if turns and context + turn.new_tokens > shape.max_context:
                break
            turns.append(turn)
            context += turn.new_tokens + turn.answer_tokens
        prefix = rng.choices(range(shape.prefixes), weights)[0]
        sessions.append(Session(t, prefix, tuple(turns)))
        t += rng.expovariate(sessions_per_s)
    return sessions


@dataclass(frozen=True)
class SessionStats:
    """Of a workload's sessions: prompt tokens (all turns) and distinct
    tokens (its own, computed once) on average, turns on average, and the
    longest prompt of any turn."""

    prompt: float
    distinct: float
    turns: float
    longest: int


def session_stats(shape: Shape, seed: int = 0, n: int = 4000) -> SessionStats:
    """SessionStats over `n` generated sessions."""
    sessions = generate(shape, 1.0, float(n), seed)
    return SessionStats(
        prompt=sum(s.prompt_tokens(shape.prefix_tokens) for s in sessions)
        / len(sessions),
        distinct=sum(s.distinct_tokens for s in sessions) / len(sessions),
        turns=sum(len(s.turns) for s in sessions) / len(sessions),
        longest=max(s.longest_prompt(shape.prefix_tokens) for s in sessions),
    )
