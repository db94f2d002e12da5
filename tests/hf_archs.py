"""Tiny configs of many transformers causal-LM architectures, written here (no downloads).

`TINY[model_type]` holds the fields that make a 2-layer model of hidden size 32 (4 heads, vocabulary
256) of that type; `tiny_config(model_type, layers=..., **overrides)` builds transformers' config and
`save_tiny(path, model_type, ...)` writes it as `path/config.json` (a folder `hf:path` names).
Per-layer lists (`layer_types`) are left to transformers, so a deeper copy keeps the type's own
pattern (Gemma 2 alternates sliding-window and global attention).
`MLP[model_type]` is the path, inside a decoder layer, of its MLP (for fault injection).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COMMON = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
GQA = dict(num_key_value_heads=2)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)

TINY: dict[str, dict[str, Any]] = {
    "llama": GQA,
    "mistral": GQA,
    "qwen2": GQA,
    "qwen3": {**GQA, "head_dim": 8},
    "gemma": {**GQA, "head_dim": 8},
    "gemma2": {**GQA, "head_dim": 8, "sliding_window": 8},
    "gemma3_text": {**GQA, "head_dim": 8, "sliding_window": 8},
    "phi": {},
    "phi3": {**GQA, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1},
    "mixtral": {**GQA, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {**GQA, **MOE, "shared_expert_intermediate_size": 32},
    "qwen3_moe": {**GQA, **MOE, "head_dim": 8},
    "olmo": {**GQA, "pad_token_id": 0, "eos_token_id": 1},
    "olmo2": {**GQA, "pad_token_id": 0, "eos_token_id": 1},
    "granite": GQA,
    "cohere": {**GQA, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2},
    "falcon": {"num_kv_heads": 2, "new_decoder_architecture": True},
    "gpt_neox": {"eos_token_id": 1, "bos_token_id": 1},
    "stablelm": GQA,
    "starcoder2": {**GQA, "eos_token_id": 1, "bos_token_id": 1},
    "bloom": {"n_head": 4, "n_layer": 2},
    "gptj": {"n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 4, "n_positions": 256},
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 256},
    "opt": {"ffn_dim": 64, "word_embed_proj_dim": 32, "max_position_embeddings": 256},
    "deepseek_v3": {
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 8,
    },
}
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")

MLP = {name: "mlp" for name in TINY}


def tiny_config(model_type: str, *, layers: int | None = None, **overrides):
    from transformers import AutoConfig

    values: dict[str, Any] = {**COMMON, **TINY[model_type], **overrides}
    if layers is not None:
        values["num_hidden_layers"] = layers
        if "n_layer" in values:
            values["n_layer"] = layers
    values.setdefault("max_position_embeddings", 256)
    values.setdefault("eos_token_id", 1)
    values.setdefault("bos_token_id", 1)
    return AutoConfig.for_model(model_type, **values)


def save_tiny(path: Path, model_type: str, *, layers: int | None = None, **overrides) -> Path:
    tiny_config(model_type, layers=layers, **overrides).save_pretrained(path)
    return Path(path)
