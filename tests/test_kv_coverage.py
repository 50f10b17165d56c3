"""docs/kv-replication-coverage.md is what tools/kv_coverage.py makes of the
0.34.0 tree with its series: the coverage table cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import kv_coverage
import pytest

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "vllm-0.34.0"
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
        "run `python tools/kv_coverage.py build/vllm-0.34.0 --write "
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
        # New in 0.34.0, declared: LFM3's attention (its short convolutions
        # keep head-sharded state), Mistral Large 4's MLA and indexer caches.
        ("Lfm3ForCausalLM", "`Attention`, `ShortConv`", "some"),
        ("MistralLarge4ForCausalLM", "`MistralIndexerCache`, `_MistralMLA`", "all"),
        # New in 0.34.0, undeclared with a reason.
        ("RicursiveForCausalLM", "`Attention`", "none"),
        # MiniMax-M3's DSpark draft withdraws what DFlash's attention declares.
        ("DSparkMiniMaxDraftModel", "`Attention`", "none"),
        # DFlash declares, but withdraws with an MXFP8 context projection.
        ("DFlashDraftModel", "`Attention`", "some"),
    ],
)
def test_known_models(page, arch, layers, status):
    cells = rows(page)[arch]
    assert cells[:2] == [layers, status], cells


@pytest.mark.parametrize(
    "arch, declared_at, why",
    [
        ("Lfm3ForCausalLM", "`lfm3.Lfm3Attention`", "state sharded by head"),
        ("RicursiveForCausalLM", "-", "TP must divide its KV heads"),
        (
            "ZayaForCausalLM",
            "`zaya.ZayaAttention` (`ZayaCCA`)",
            "`zaya.ZayaAttention` (`Attention`): TP does not shard this attention",
        ),
        (
            "DSparkMiniMaxDraftModel",
            "-",
            "`models.minimax_m3.common.dspark.MiniMaxM3DSparkAttention`: withdrawn",
        ),
        (
            "DFlashDraftModel",
            "`qwen3_dflash.DFlashQwen3Attention`",
            "`qwen3_dflash.DFlashQwen3Model`: withdrawn",
        ),
    ],
)
def test_known_sites(page, arch, declared_at, why):
    """Where 0.34.0's new layers declare, and why not where they do not."""
    cells = rows(page)[arch]
    assert cells[2] == declared_at, cells
    assert why in cells[3], cells


def test_reviewed_layers_give_their_reason(page):
    """Every reason the tool knows stands on the page, at its class: no
    reviewed layer reads "not reviewed" because the code that builds it
    moved."""
    why = "\n".join(cells[3] for cells in rows(page).values())
    for (site, layer), reason in kv_coverage.REASONS.items():
        assert (
            f"`{site}`: {reason}" in why or f"`{site}` (`{layer}`): {reason}" in why
        ), (site, layer)
