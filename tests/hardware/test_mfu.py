"""The achievable-MFU table: each row's MFU is its published tokens/s times the model's FLOPs per token over
the peak table's dense figure, and the FLOPs per token are ampkit's own count of the model."""

from __future__ import annotations

import json

import pytest
import torch

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
        # CUDA-core fp32 GEMMs run near their peak (V100 BERT: 0.84); tensor-core rows lower
        assert 0.05 < row.mfu < (0.9 if row.peak_key == "fp32" else 0.8)
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


def test_bert_large_flops_per_token_counts_the_models_linears():
    """BERT-Large's FLOPs per token (the fp32/TF32 rows' model) from its modules: 6 x the weights every token
    multiplies (the encoder's Linears, the MLM head's transform and its tied decoder; not the pooler and the
    next-sentence classifier, which see one position a sequence) + PaLM's attention term at T = 128."""
    from torch import nn
    from transformers import BertConfig, BertForPreTraining

    from ampkit.hardware.mfu import BERT_LARGE_FLOPS_PER_TOKEN, BERT_SEQ
    from ampkit.plan.analytic.compute import flops_per_token

    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    with torch.device("meta"):
        model = BertForPreTraining(config)
    per_token = [
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and "pooler" not in name and "seq_relationship" not in name
    ]
    attention = 12 * config.num_hidden_layers * config.hidden_size * BERT_SEQ
    counted = flops_per_token(sum(per_token), attention_flops=attention)
    assert counted == pytest.approx(BERT_LARGE_FLOPS_PER_TOKEN, rel=2e-3)


def test_fp32_and_tf32_rows_measure_less_than_the_datasheet_ratio():
    """The published runs' mixed-precision gains (1.83x over TF32 on an A100, 4.48x over fp32 on a V100) are
    what the rows give back; the datasheets would say 2x and 8x."""
    tf32, bf16 = achievable_mfu("A100-80GB", "tf32"), achievable_mfu("A100-80GB", "bf16")
    fp32, fp16 = achievable_mfu("V100-32GB", "fp32"), achievable_mfu("V100-32GB", "fp16")
    assert tf32 is not None and bf16 is not None and fp32 is not None and fp16 is not None
    assert fp16.tokens_per_s / fp32.tokens_per_s == pytest.approx(4.48, abs=0.01)
    v100 = GPUS["V100-32GB"]
    ratio = (fp16.mfu * v100.peak_flops("fp16")) / (fp32.mfu * v100.peak_flops("fp32"))
    assert ratio == pytest.approx(fp16.tokens_per_s / fp32.tokens_per_s)
    assert ratio < v100.peak_flops("fp16") / v100.peak_flops("fp32")
