"""The achievable-MFU table: each row's MFU is its published tokens/s times the model's FLOPs per token over
the peak table's dense figure, and the FLOPs per token are ampkit's own count of the model."""

from __future__ import annotations

import json

import pytest

from ampkit.hardware import GPUS
from ampkit.hardware.mfu import LLAMA3_8B_FLOPS_PER_TOKEN, MFU_ROWS, achievable_mfu
from ampkit.plan.analytic.compute import model_flops_per_token
from ampkit.plan.describe import describe_model

LLAMA3_8B = {  # meta-llama/Meta-Llama-3-8B's config.json, the fields the planner reads
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
}


def test_llama3_8b_flops_per_token_is_ampkits_own_count(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    desc = describe_model(str(path))
    assert model_flops_per_token(desc, 8192) == pytest.approx(LLAMA3_8B_FLOPS_PER_TOKEN, rel=2e-3)


def test_rows_name_table_gpus_sources_and_plausible_mfu():
    for row in MFU_ROWS:
        assert row.gpu in GPUS and GPUS[row.gpu].peak_flops(row.peak_key)
        assert row.source.startswith("https://")
        assert 0.05 < row.mfu < 0.8
        assert row.mfu == pytest.approx(row.tokens_per_s * row.flops_per_token / GPUS[row.gpu].peak_flops(row.peak_key))


def test_torchtitan_h100_rows_match_the_mfu_torchtitan_quotes():
    """torchtitan's docs: 33% (eager) and 39% (compiled) MFU for 5,762 and 6,667 tokens/s/GPU."""
    eager = achievable_mfu("H100-80GB", "bf16")
    assert eager is not None and not eager.compiled and eager.tokens_per_s == 5762
    assert eager.mfu == pytest.approx(0.33, abs=0.01)
    compiled = next(r for r in MFU_ROWS if r.compiled)
    assert compiled.mfu == pytest.approx(0.39, abs=0.01)


def test_fp16_reads_bf16s_row_at_an_equal_peak_and_missing_rows_are_none():
    assert achievable_mfu("H100-80GB", "fp16") is achievable_mfu("H100-80GB", "bf16")
    assert achievable_mfu("H100-80GB", "fp32") is None
    assert achievable_mfu("H200", "bf16") is None
