"""The verdicts of the end-to-end check (e2e/run.py) on made-up engine
results: it passes what a correct series shows and fails on each way the
ranks or the series could disagree with the declarations. The engine runs
themselves are `make e2e`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
import models  # noqa: E402
import run  # noqa: E402

MODELS = {m.name: m for m in models.MODELS}
# Two requests of 20 and 40 tokens in 16-token blocks: 2 + 3 blocks written.
BLOCKS = {"1": "a1", "2": "a2", "3": "a3", "4": "a4", "5": "a5"}


def result(replicas, rank1_blocks=None, scheduler=None, base_layout=False):
    """engine.py's result for two ranks: rank 0 wrote BLOCKS, rank 1 wrote
    rank1_blocks (default: the same bytes)."""
    per_rank = [BLOCKS, BLOCKS if rank1_blocks is None else rank1_blocks]
    return {
        "block_size": 16,
        "tokens_written": [20, 40],
        "scheduler_kv_tp_replicas": replicas if scheduler is None else scheduler,
        "workers": [
            {
                "rank": rank,
                "kv_tp_replicas": replicas,
                "layers": {"model.layers.0.self_attn.attn": {"blocks": blocks}},
            }
            for rank, blocks in enumerate(per_rank)
        ],
        "offloading": {
            "kv_tp_replicas": replicas,
            "replicated_layout": replicas == 2 or base_layout,
            "world_size": 2,
            "host_copies_per_chunk": 1 if replicas == 2 else 2,
        },
        "wall_s": 30,
    }


DIFFERENT = {b: h.replace("a", "b") for b, h in BLOCKS.items()}


def test_what_a_correct_series_shows_passes():
    ok, text = run.report(
        [
            (MODELS["llama-kv1"], "series", result(2)),
            (MODELS["llama-kv1"], "base", result(None)),
            (MODELS["llama-kv2"], "series", result(1, DIFFERENT)),
        ]
    )
    assert ok, text
    assert "FAIL" not in text
    assert "0 vs 1: identical" in text and "0 vs 1: 5 differ" in text
    assert "same as series" in text


@pytest.mark.parametrize(
    "name, got",
    [
        # A replica group whose ranks hold different bytes in one block.
        ("llama-kv1", result(2, {**BLOCKS, "3": "b3"})),
        # The negative control with the same KV on both ranks: what
        # load_format="dummy" weights would give.
        ("llama-kv2", result(1)),
        # Replication the bytes do not show is claimed.
        ("llama-kv2", result(2, DIFFERENT)),
        # Replication the bytes show is not claimed, by one of the parts.
        ("llama-kv1", result(2, scheduler=1)),
        ("llama-kv1", result(1)),
        # A rank wrote fewer blocks than the generation needs.
        ("llama-kv1", result(2, {b: h for b, h in BLOCKS.items() if b != "5"})),
    ],
)
def test_disagreement_fails(name, got):
    ok, text = run.report([(MODELS[name], "series", got)])
    assert not ok
    assert "FAIL" in text


def test_base_must_lack_the_field_and_write_the_same_bytes():
    series = (MODELS["llama-kv1"], "series", result(2))
    ok, text = run.report([series, (MODELS["llama-kv1"], "base", result(2))])
    assert not ok, "the base has no kv_tp_replicas"
    changed = {b: h.replace("a", "c") for b, h in BLOCKS.items()}
    ok, text = run.report(
        [series, (MODELS["llama-kv1"], "base", result(None, changed))]
    )
    assert not ok and "DIFFERS from series" in text


def test_log_line_must_be_in_every_series_log(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("INFO 11-29 [factory.py:57] Creating offloading spec\n")
    ok, text = run.log_line_report({"llama-kv1": log})
    assert not ok and str(log) in text

    line = "INFO 11-29 [offloading_connector.py:90] ... 1 host copy per chunk ..."
    log.write_text(line + "\n")
    ok, text = run.log_line_report({"llama-kv1": log})
    assert ok and text == f"llama-kv1: {line}"
