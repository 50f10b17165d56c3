"""The architectures the demo measures, with their real KV shapes.

Each layer kind is built by the vLLM layer class that owns it
(bench/kv_tp_worker.py):
- "mla": MLAAttention's latent cache, kv_lora_rank 512 + rope 64 (DeepSeek-V3).
- "dsv32": DeepSeek-V3.2, fp8_ds_mla latent (656 B/token) + its indexer
  cache (132 B/token).
- "dsv4": DeepSeek-V4-like: compressed MLA (head 512, 4 tokens/state), its
  indexer cache, and the 128-token sliding-window cache.
- "gqa": grouped-query attention, head size 128, bf16, `kv_heads` in all.
- "mamba": a Mamba2 mixer, TP-sharded by head.
"""

from __future__ import annotations

from dataclasses import dataclass

TP_SIZES = (1, 2, 4, 8, 16)
DCP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Arch:
    name: str
    layers: tuple[str, ...]
    use_mla: bool
    kv_heads: int | None = None
    cache_dtype: str = "auto"
    block_size: int = 64

    def supports(self, tp: int, dcp: int) -> bool:
        if dcp == 1:
            return True
        # vLLM's ModelConfig: DCP on GQA needs tp > kv_heads and
        # dcp <= tp // kv_heads (it splits the replicas of each head).
        if "gqa" in self.layers:
            assert self.kv_heads is not None
            return tp > self.kv_heads and dcp <= tp // self.kv_heads
        return True


ARCHITECTURES = (
    Arch("DeepSeek-V3 (MLA)", ("mla",) * 61, use_mla=True),
    Arch("DeepSeek-V3.2 (MLA + indexer)", ("dsv32",) * 61, use_mla=True),
    Arch("DeepSeek-V4-like (MLA + indexer + SWA)", ("dsv4",) * 43, use_mla=True),
    Arch(
        "Llama-3.1-405B-like (GQA, 8 KV heads)",
        ("gqa",) * 126,
        use_mla=False,
        kv_heads=8,
    ),
    Arch("GLM-4.5-like (GQA, 8 KV heads)", ("gqa",) * 92, use_mla=False, kv_heads=8),
    Arch("Qwen3-235B-like (GQA, 4 KV heads)", ("gqa",) * 94, use_mla=False, kv_heads=4),
    Arch(
        "Qwen2.5-1.5B-like (GQA, 2 KV heads)", ("gqa",) * 28, use_mla=False, kv_heads=2
    ),
    Arch("MLA + GQA-8 mix", ("mla", "gqa") * 20, use_mla=True, kv_heads=8),
    Arch("MLA + Mamba hybrid", ("mla", "mamba", "mamba", "mamba") * 12, use_mla=True),
)


def distinct_shards(kind: str, arch: Arch, tp: int, dcp: int) -> int:
    """Into how many distinct pieces one layer's KV splits over `tp` ranks,
    by the model's math (not by what vLLM declares): MLA-style caches are the
    same on every rank, GQA has one piece per KV head (at most one per rank),
    a head-sharded Mamba state one per rank; DCP splits attention KV by token
    over `dcp` ranks on top."""
    if kind in ("mla", "dsv32", "dsv4"):
        return dcp
    if kind == "gqa":
        assert arch.kv_heads is not None
        return min(tp, arch.kv_heads) * dcp
    if kind == "mamba":
        return tp
    raise ValueError(kind)
