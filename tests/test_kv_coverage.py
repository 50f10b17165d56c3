"""docs/kv-replication-coverage.md is what tools/kv_coverage.py makes of the
0.33.0 tree with its series: the coverage table cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import kv_coverage
import pytest

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "vllm-0.33.0"
PAGE = ROOT / "docs" / "kv-replication-coverage.md"


@pytest.fixture(scope="module")
def index() -> kv_coverage.Index:
    return kv_coverage.Index(TREE)


@pytest.fixture(scope="module")
def page(index) -> str:
    return kv_coverage.page(TREE, index)


def rows(text: str) -> dict[str, list[str]]:
    out = {}
    for line in text.splitlines():
        if m := re.match(r"\| `([^`]+)` \|(.*)\|$", line):
            out[m[1]] = [cell.strip() for cell in m[2].split("|")]
    return out


def test_the_page_is_what_the_code_says(page):
    assert PAGE.read_text() == page, (
        "run `python tools/kv_coverage.py build/vllm-0.33.0 --write "
        "docs/kv-replication-coverage.md` and review the difference"
    )


def test_every_registered_architecture_has_a_row(page, index):
    assert set(rows(page)) == set(kv_coverage.registry(index))


@pytest.mark.parametrize(
    "arch, layers, status",
    [
        ("LlamaForCausalLM", "`Attention`", "all"),
        ("Qwen3ForCausalLM", "`Attention`", "all"),
        ("Glm4MoeForCausalLM", "`Attention`", "all"),
        ("CohereForCausalLM", "`Attention`", "none"),
        # The attention layers declare; the gated DeltaNet state is sharded.
        ("Qwen3_5ForCausalLM", "`Attention`, `QwenGatedDeltaNetAttention`", "some"),
    ],
)
def test_known_models(page, arch, layers, status):
    cells = rows(page)[arch]
    assert cells[:2] == [layers, status], cells
