"""The architectures the demo measures, with their real KV shapes.

Each layer kind is built by the vLLM layer class that owns it
(bench/kv_tp_worker.py):
- "mla": MLAAttention's latent cache, kv_lora_rank 512 + rope 64 (DeepSeek-V3).
- "dsv32": DeepSeek-V3.2, fp8_ds_mla latent (656 B/token) + its indexer
  cache (132 B/token).
- "dsv4": DeepSeek-V4-like: compressed MLA (head 512, 4 tokens/state), its
  indexer cache, and the 128-token sliding-window cache.
- "gqa": grouped-query attention, bf16, `kv_heads` in all, of `head_dim`.
- "draft": the attention layer of a Llama-based EAGLE-3 draft: 8 KV heads of
  128.
- "mamba": a Mamba2 mixer, TP-sharded by head.
- "linear": the linear-attention (GDN, KDA, Mamba2) state of the model whose
  published config `model_dir` (bench/models/) holds: shapes and dtypes from
  the model class's own get_mamba_state_shape_from_config / dtype, and the
  block sizes vLLM picks for the hybrid (Platform._align_hybrid_block_size:
  the attention page holds one state, the state page padded to it).
  TP-sharded by head.
"""

from __future__ import annotations

from dataclasses import dataclass

TP_SIZES = (1, 2, 4, 8, 16)
DCP_SIZES = (1, 2, 4, 8)
# The hosts a TP group spans, at each TP size: one host of up to 8 GPUs (an
# HGX H100/H200 node); TP 16 also as two such hosts and as four hosts of 4
# (GB200 NVL72 trays), besides a 16-GPU host.
HOSTS = {16: (1, 2, 4)}
# Pipeline-parallel deployments, as (PP, hosts), at each TP size: TP 8 x PP 2
# on two hosts of 8 (a stage on each), the other usual way to serve
# DeepSeek-V3-size models, and on one host of 16.
PIPELINES = {8: ((2, 2), (2, 1))}
# GPUs per host in the deployments people run: the summary's shape.
GPUS_PER_HOST = 8


def hosts_of(tp: int) -> tuple[int, ...]:
    """The numbers of hosts the demo measures TP ``tp`` on."""
    return HOSTS.get(tp, (1,))


def deployments_of(tp: int) -> tuple[tuple[int, int], ...]:
    """The (PP, hosts) the demo measures TP ``tp`` on: PP 1 on each of
    hosts_of(tp), then the pipelines."""
    return tuple((1, hosts) for hosts in hosts_of(tp)) + PIPELINES.get(tp, ())


def shape(tp: int, hosts: int, pp: int = 1) -> str:
    """A deployment as hosts x GPUs per host."""
    return f"{hosts} x {tp * pp // hosts}"


@dataclass(frozen=True)
class Arch:
    name: str
    layers: tuple[str, ...]
    use_mla: bool
    kv_heads: int | None = None
    cache_dtype: str = "auto"
    block_size: int = 64
    # The TP size the model is usually served at: its line of the summary.
    usual_tp: int = 8
    head_dim: int = 128
    # bench/models/<model_dir>/config.json: a hybrid's published config.
    model_dir: str | None = None
    # Draft layers (an EAGLE-3 or MTP drafter), the last of `layers`: under
    # pipeline parallelism they run on the last stage, beside the sampler.
    drafts: int = 0

    @property
    def usual_hosts(self) -> int:
        """The hosts its usual TP size spans, of GPUS_PER_HOST GPUs each."""
        return max(1, self.usual_tp // GPUS_PER_HOST)

    def kv_heads_of(self, kind: str) -> int | None:
        return {"gqa": self.kv_heads, "draft": DRAFT_KV_HEADS}.get(kind)

    def supports(self, tp: int, dcp: int) -> bool:
        if dcp == 1:
            return True
        # vLLM's ModelConfig: DCP on GQA needs tp > kv_heads and
        # dcp <= tp // kv_heads (it splits the replicas of each head).
        for kind in {"gqa", "draft"} & set(self.layers):
            heads = self.kv_heads_of(kind)
            assert heads is not None
            if not (tp > heads and dcp <= tp // heads):
                return False
        return True


DRAFT_KV_HEADS = 8


def published_config(model_dir: str) -> dict:
    """bench/models/<model_dir>/config.json."""
    import json
    from pathlib import Path

    path = Path(__file__).parent / "models" / model_dir / "config.json"
    return json.loads(path.read_text())


def nemotron_nano_layers() -> tuple[str, ...]:
    """Nemotron-Nano-like: its hybrid_override_pattern, M a Mamba2 layer and *
    an attention layer (the MLP layers keep no cache)."""
    pattern = published_config("nemotron-nano-like")["hybrid_override_pattern"]
    return tuple({"M": "linear", "*": "gqa"}[c] for c in pattern if c in "M*")


def kimi_linear_layers() -> tuple[str, ...]:
    """Kimi-Linear-like: its linear_attn_config, whose kda_layers (numbered
    from 1) are KDA layers and the others MLA layers."""
    config = published_config("kimi-linear-like")
    kda = set(config["linear_attn_config"]["kda_layers"])
    return tuple(
        "linear" if i + 1 in kda else "mla" for i in range(config["num_hidden_layers"])
    )


ARCHITECTURES = (
    Arch("DeepSeek-V3 (MLA)", ("mla",) * 61, use_mla=True),
    Arch("DeepSeek-V3.2 (MLA + indexer)", ("dsv32",) * 61, use_mla=True),
    Arch("DeepSeek-V4-like (MLA + indexer + SWA)", ("dsv4",) * 43, use_mla=True),
    Arch(
        "Llama-3.1-405B-like (GQA, 8 KV heads)",
        ("gqa",) * 126,
        use_mla=False,
        kv_heads=8,
        usual_tp=16,
    ),
    Arch(
        "GLM-4.5-like (GQA, 8 KV heads)",
        ("gqa",) * 92,
        use_mla=False,
        kv_heads=8,
        usual_tp=16,
    ),
    Arch("Qwen3-235B-like (GQA, 4 KV heads)", ("gqa",) * 94, use_mla=False, kv_heads=4),
    Arch(
        "Qwen2.5-1.5B-like (GQA, 2 KV heads)",
        ("gqa",) * 28,
        use_mla=False,
        kv_heads=2,
        usual_tp=2,
    ),
    Arch("MLA + GQA-8 mix", ("mla", "gqa") * 20, use_mla=True, kv_heads=8),
    Arch("MLA + Mamba hybrid", ("mla", "mamba", "mamba", "mamba") * 12, use_mla=True),
    # Setups people deploy: targets with drafts, hybrids.
    Arch(
        "DeepSeek-V3 + EAGLE-3 draft (8 KV heads)",
        ("mla",) * 61 + ("draft",),
        use_mla=True,
        drafts=1,
    ),
    Arch("DeepSeek-V3 + MTP draft", ("mla",) * 62, use_mla=True, drafts=1),
    Arch(
        "Qwen3-235B-like + EAGLE-3 draft (8 KV heads)",
        ("gqa",) * 94 + ("draft",),
        use_mla=False,
        kv_heads=4,
        drafts=1,
    ),
    Arch(
        "Qwen3.5/Qwen3-Next-like (3 GDN : 1 attention, 2 KV heads)",
        ("linear", "linear", "linear", "gqa") * 12,
        use_mla=False,
        kv_heads=2,
        head_dim=256,
        model_dir="qwen3-next-like",
    ),
    Arch(
        "Nemotron-Nano-like (Mamba2 hybrid, 2 KV heads)",
        nemotron_nano_layers(),
        use_mla=False,
        kv_heads=2,
        model_dir="nemotron-nano-like",
    ),
    Arch(
        "Kimi-Linear-like (3 KDA : 1 MLA)",
        kimi_linear_layers(),
        use_mla=True,
        model_dir="kimi-linear-like",
    ),
)


def distinct_shards(kind: str, arch: Arch, tp: int, dcp: int, hosts: int = 1) -> int:
    """Into how many distinct pieces one layer's KV splits over `tp` ranks,
    by the model's math (not by what vLLM declares), counted once on each of
    `hosts` hosts (consecutive ranks, an equal number on each) that holds a
    part of it: MLA-style caches are the same on every rank, GQA has one
    piece per KV head (at most one per rank: runs of tp / kv_heads ranks hold
    one), a head-sharded Mamba state one per rank; DCP splits attention KV by
    token over `dcp` ranks on top (rank r holds token shard r % dcp, within
    each run of a GQA head)."""
    if kind in ("mla", "dsv32", "dsv4"):

        def piece(rank: int) -> object:
            return rank % dcp
    elif kind in ("gqa", "draft"):
        heads = arch.kv_heads_of(kind)
        assert heads is not None

        def piece(rank: int) -> object:
            if tp <= heads:
                return rank
            return rank // (tp // heads), rank % dcp
    elif kind in ("mamba", "linear"):

        def piece(rank: int) -> object:
            return rank
    else:
        raise ValueError(kind)
    per_host = tp // hosts
    return sum(
        len({piece(rank) for rank in range(host * per_host, (host + 1) * per_host)})
        for host in range(hosts)
    )


def wanted(name: str, tp: int, models: list[str] | None, tps: list[int] | None) -> bool:
    """`make demo ARGS="--model M --tp T"`: whether the row of model `name`
    at `tp` is shown (a name containing one of `models`, any case; one of
    `tps`; no filter: every row)."""
    return (not models or any(m.lower() in name.lower() for m in models)) and (
        not tps or tp in tps
    )
