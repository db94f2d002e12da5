"""Real-size transformers configs from the models' published config.json files (the shape fields; no
downloads): what the planner benchmarks plan. Each is a dict written as `FOLDER/config.json`.

`TRACED_ONLY`: families the analytic engine does not know (the traced engine answers every row);
`LLAMA3_70B`: an analytic family at 70B scale (the traced engine cross-checks every row).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN3_0_6B = {  # Qwen/Qwen3-0.6B
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
GEMMA2_2B = {  # google/gemma-2-2b
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "query_pre_attn_scalar": 256,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}
PHI3_MINI = {  # microsoft/Phi-3-mini-4k-instruct
    "model_type": "phi3",
    "architectures": ["Phi3ForCausalLM"],
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "vocab_size": 32064,
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "sliding_window": 2047,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 32000,
    "pad_token_id": 32000,
}
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_act": "silu",
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
OLMO2_1B = {  # allenai/OLMo-2-0425-1B
    "model_type": "olmo2",
    "architectures": ["Olmo2ForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "hidden_act": "silu",
    "vocab_size": 100352,
    "max_position_embeddings": 4096,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "pad_token_id": 100277,
    "eos_token_id": 100257,
}
LLAMA3_70B = {  # meta-llama/Meta-Llama-3-70B
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}

TRACED_ONLY: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": QWEN3_0_6B,
    "Gemma-2-2B": GEMMA2_2B,
    "Phi-3-mini": PHI3_MINI,
    "Mixtral-8x7B": MIXTRAL_8X7B,
    "OLMo-2-1B": OLMO2_1B,
}
REAL_SIZE: dict[str, dict[str, Any]] = {**TRACED_ONLY, "Llama-3-70B": LLAMA3_70B}


def write_config(folder: Path, config: dict[str, Any]) -> Path:
    """`folder/config.json` holding `config` (the folder is what `--model hf:FOLDER` names)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder
