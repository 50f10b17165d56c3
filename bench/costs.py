"""The cost model of `make bench` (bench/bench.py): each deployment's GPU
memory, the FLOPs of a prefill, and how long a request holds its blocks,
from the model's published parameters and the accelerator's datasheet.

Every figure is a named constant with its source. Times are modelled at
peak rates, one request at a time (no queueing behind other requests): a
lower bound, the same for the release and the series, which differ only in
what hits. bench/bench.py reports the prefill FLOPs the cache saves (as
GPU-hours at peak), not a latency.

Pure Python (no vLLM): the driver and the tests use it as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# NVIDIA H200 SXM datasheet (nvidia.com/en-us/data-center/h200): 141 GB of
# HBM3e at 4.8 TB/s; 989 TFLOP/s of dense bf16 tensor-core compute (the
# datasheet's 1,979 TFLOP/s is with 2:4 sparsity).
H200_HBM_BYTES = 141e9
H200_HBM_BYTES_PER_S = 4.8e12
H200_BF16_FLOP_PER_S = 989e12
ACCELERATOR = "H200"
# vLLM's default share of GPU memory for weights, activations and KV cache
# (CacheConfig.gpu_memory_utilization); the bench leaves activations out,
# so the KV cache gets this share less the weights.
GPU_MEMORY_UTILIZATION = 0.9
# vLLM's default prefill chunk for large models on a GPU
# (SchedulerConfig.max_num_batched_tokens under the OpenAI server on a
# H100/H200-class GPU): the bench's scheduler runs with it, and each chunk
# reads the weights once.
MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class Compute:
    """What a model costs per token: its published parameter counts and
    weight format, and its attention's per-context-token work.

    attn_flops_per_context_token: FLOPs of one new token attending to one
    earlier token, over every attention layer: 2 x query heads x (qk head
    dim + v head dim) per layer. attention_window: the context a token
    attends to at most (a sparse or sliding attention), None = all of it.
    """

    source: str
    total_params: float
    active_params: float
    weight_bytes_per_param: float
    attn_flops_per_context_token: float
    attention_window: int | None = None

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param


def _attn(layers: int, heads: int, qk_dim: int, v_dim: int) -> int:
    return 2 * layers * heads * (qk_dim + v_dim)


# DeepSeek-V3 technical report (arXiv:2412.19437): 671B parameters, 37B
# active per token, FP8 weights as released; 61 layers of MLA, 128 heads,
# qk head dim 192 (128 + 64 rope), v head dim 128.
DEEPSEEK_V3 = Compute(
    "DeepSeek-V3 (arXiv:2412.19437)", 671e9, 37e9, 1, _attn(61, 128, 192, 128)
)
# DeepSeek-V3.2-Exp: DeepSeek-V3's weights and MLA; its sparse attention
# (DSA) attends to the top 2048 tokens its indexer selects.
DEEPSEEK_V32 = Compute(
    "DeepSeek-V3.2-Exp (DeepSeek-V3 + DSA, top-k 2048)",
    671e9,
    37e9,
    1,
    _attn(61, 128, 192, 128),
    attention_window=2048,
)
# Llama 3 herd of models (arXiv:2407.21783): 405B dense, bf16, 126 layers,
# 128 query heads of 128.
LLAMA_405B = Compute(
    "Llama 3.1 405B (arXiv:2407.21783)", 405e9, 405e9, 2, _attn(126, 128, 128, 128)
)
# GLM-4.5 report (arXiv:2508.06471): 355B parameters, 32B active, bf16; 92
# layers, 96 query heads of 128.
GLM_45 = Compute("GLM-4.5 (arXiv:2508.06471)", 355e9, 32e9, 2, _attn(92, 96, 128, 128))
# Qwen3 technical report (arXiv:2505.09388): Qwen3-235B-A22B, 235B
# parameters, 22B active, bf16; 94 layers, 64 query heads of 128.
QWEN3_235B = Compute(
    "Qwen3-235B-A22B (arXiv:2505.09388)", 235e9, 22e9, 2, _attn(94, 64, 128, 128)
)
# Qwen2.5 technical report (arXiv:2412.15115): Qwen2.5-1.5B, 1.54B, bf16; 28
# layers, 12 query heads of 128.
QWEN25_15B = Compute(
    "Qwen2.5-1.5B (arXiv:2412.15115)", 1.54e9, 1.54e9, 2, _attn(28, 12, 128, 128)
)
# Qwen3-Next-80B-A3B (model card): 80B parameters, 3B active, bf16; its 12
# gated-attention layers (every 4th of 48) have 16 query heads of 256
# (bench/models/qwen3-next-like/config.json); the linear-attention layers
# do no per-context-token work.
QWEN3_NEXT = Compute(
    "Qwen3-Next-80B-A3B (model card)", 80e9, 3e9, 2, _attn(12, 16, 256, 256)
)
# NVIDIA-Nemotron-Nano-9B-v2 (model card): 8.9B, bf16; its attention
# layers (4 of 56, the '*' of hybrid_override_pattern in
# bench/models/nemotron-nano-like/config.json) have 40 query heads of 128.
NEMOTRON_NANO = Compute(
    "NVIDIA-Nemotron-Nano-9B-v2 (model card)", 8.9e9, 8.9e9, 2, _attn(4, 40, 128, 128)
)
# Kimi-Linear-48B-A3B (model card): 48B parameters, 3B active, bf16; its 7
# MLA layers (1 of each 4 of 27, bench/models/kimi-linear-like/config.json)
# have 32 query heads, qk head dim 192 (128 + 64 rope), v head dim 128.
KIMI_LINEAR = Compute(
    "Kimi-Linear-48B-A3B (model card)", 48e9, 3e9, 2, _attn(7, 32, 192, 128)
)

# Each demo deployment (bench/architectures.py, by name) and its compute.
# The demo's synthetic mixes and its DeepSeek-V4-like model have no
# published weights: they take DeepSeek-V3's; a draft's own compute (one
# layer) is left out.
COMPUTE = {
    "DeepSeek-V3 (MLA)": DEEPSEEK_V3,
    "DeepSeek-V3.2 (MLA + indexer)": DEEPSEEK_V32,
    "DeepSeek-V4-like (MLA + indexer + SWA)": DEEPSEEK_V3,
    "Llama-3.1-405B-like (GQA, 8 KV heads)": LLAMA_405B,
    "GLM-4.5-like (GQA, 8 KV heads)": GLM_45,
    "Qwen3-235B-like (GQA, 4 KV heads)": QWEN3_235B,
    "Qwen2.5-1.5B-like (GQA, 2 KV heads)": QWEN25_15B,
    "MLA + GQA-8 mix": DEEPSEEK_V3,
    "MLA + Mamba hybrid": DEEPSEEK_V3,
    "DeepSeek-V3 + EAGLE-3 draft (8 KV heads)": DEEPSEEK_V3,
    "DeepSeek-V3 + MTP draft": DEEPSEEK_V3,
    "Qwen3-235B-like + EAGLE-3 draft (8 KV heads)": QWEN3_235B,
    "Qwen3.5/Qwen3-Next-like (3 GDN : 1 attention, 2 KV heads)": QWEN3_NEXT,
    "Nemotron-Nano-like (Mamba2 hybrid, 2 KV heads)": NEMOTRON_NANO,
    "Kimi-Linear-like (3 KDA : 1 MLA)": KIMI_LINEAR,
}


def gpu_kv_bytes(compute: Compute, gpus: int) -> float:
    """Each GPU's KV cache memory: its share of GPU memory less its share of
    the weights (TP splits them evenly)."""
    free = H200_HBM_BYTES * GPU_MEMORY_UTILIZATION - compute.weight_bytes / gpus
    if free <= 0:
        raise ValueError(f"{compute.source}: the weights do not fit {gpus} GPUs")
    return free


def prefill_flops(compute: Compute, cached: int, computed: int) -> float:
    """The FLOPs of a prefill of `computed` tokens after `cached` ones: 2 per
    active parameter per token, and each token's attention to the tokens
    before it (within the window)."""
    if computed <= 0:
        return 0.0
    window = compute.attention_window
    if window is None:
        # Sum over the new tokens of the context each attends to.
        context = computed * cached + computed * (computed - 1) / 2
    else:
        # The first tokens attend to cached + i < window tokens, the rest
        # to the window.
        below = max(0, min(computed, window - cached))
        context = below * cached + below * (below - 1) / 2 + (computed - below) * window
    return (
        2 * compute.active_params * computed
        + compute.attn_flops_per_context_token * context
    )


def prefill_seconds(compute: Compute, gpus: int, cached: int, computed: int) -> float:
    """Prefill of `computed` tokens after `cached` ones, on `gpus` GPUs at
    peak (prefill_flops), and one read of every GPU's weights per chunk of
    MAX_NUM_BATCHED_TOKENS."""
    if computed <= 0:
        return 0.0
    chunks = math.ceil(computed / MAX_NUM_BATCHED_TOKENS)
    weights = chunks * compute.weight_bytes / gpus / H200_HBM_BYTES_PER_S
    flops = prefill_flops(compute, cached, computed)
    return flops / (gpus * H200_BF16_FLOP_PER_S) + weights


def peak_prefill_tokens_per_s(compute: Compute, gpus: int) -> float:
    """Prompt tokens a second the GPUs compute at peak, attention aside."""
    return gpus * H200_BF16_FLOP_PER_S / (2 * compute.active_params)


def decode_seconds_per_token(
    compute: Compute, gpus: int, context_rank_bytes: float
) -> float:
    """One decode step of one sequence: every GPU reads its weights and its
    KV of the context (memory bound at batch 1)."""
    return (compute.weight_bytes / gpus + context_rank_bytes) / H200_HBM_BYTES_PER_S
