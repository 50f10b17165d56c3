"""Tiny models the end-to-end check writes itself: a Hugging Face config.json
and a seeded random safetensors checkpoint each.

A real checkpoint, not `load_format="dummy"`: dummy weights are seeded the
same on every TP rank, so the KV heads of different ranks would come out
identical and the negative control could not fail. Every parameter here
(norm weights included, so Qwen3's per-head k_norm matters) is random, from
one seed per model: the same bytes on every run.

    python e2e/models.py DIR      writes DIR/<model>/ for every model
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

SEED = 2026
# Small enough to start in seconds on 2 cores, big enough to be a real model:
# every architecture below has 2 layers, hidden size 256, 4 query heads.
COMMON = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(frozen=True)
class Model:
    name: str
    architecture: str
    config: dict
    # kv_tp_replicas at TP 2 that the series must report: TP ranks in a
    # replica group hold byte-identical KV.
    expected_replicas: int
    why: str


MODELS = [
    Model(
        "llama-kv1",
        "LlamaForCausalLM",
        {**COMMON, "model_type": "llama", "num_key_value_heads": 1, "head_dim": 64},
        2,
        "1 KV head at TP 2: both ranks hold that head",
    ),
    Model(
        "llama-kv2",
        "LlamaForCausalLM",
        {**COMMON, "model_type": "llama", "num_key_value_heads": 2, "head_dim": 64},
        1,
        "negative control: 2 KV heads at TP 2, one per rank",
    ),
    Model(
        "qwen3-kv1",
        "Qwen3ForCausalLM",
        {**COMMON, "model_type": "qwen3", "num_key_value_heads": 1, "head_dim": 64},
        2,
        "1 KV head at TP 2; the per-head k_norm is on the path to the cache",
    ),
    Model(
        "deepseek-v2-mla",
        "DeepseekV2ForCausalLM",
        {
            **COMMON,
            "model_type": "deepseek_v2",
            "num_key_value_heads": 4,
            "q_lora_rank": None,
            # What vLLM's CPU MLA backends support: a 576-wide latent entry.
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 64,
            "v_head_dim": 64,
            # Dense MLP on every layer (the first 2 of 2): no MoE.
            "first_k_dense_replace": 2,
            "n_routed_experts": 4,
        },
        2,
        "MLA: one latent cache, the same on every rank",
    ),
]


def write(model: Model, dest: Path) -> Path:
    """Write `model` to dest/<name>/ (config.json, model.safetensors)."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    folder = dest / model.name
    config_cls = transformers.AutoConfig.for_model(model.config["model_type"])
    config = type(config_cls).from_dict(
        {**model.config, "architectures": [model.architecture], "dtype": "bfloat16"}
    )
    torch.manual_seed(SEED)
    with torch.device("cpu"):
        hf_model = getattr(transformers, model.architecture)(config)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, param in sorted(hf_model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * noise)  # not 1: the norm's weight matters
            else:
                param.copy_(0.05 * noise)
    hf_model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    written = json.loads((folder / "config.json").read_text())
    assert written["architectures"] == [model.architecture], written
    return folder


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for model in MODELS:
        print(write(model, Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
