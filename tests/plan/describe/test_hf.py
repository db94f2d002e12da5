"""Exact counts for any transformers architecture, from its config on the meta device.

- a table of tiny configs of 25 architectures: the planner's count equals transformers'
  `num_parameters()` (meta and real), tensor by tensor, and MoE active counts follow the experts;
- published counts of real models, from their public configs (written out here), built on the
  meta device in milliseconds: the model cards' numbers and transformers' own `num_parameters()`.
"""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.models.hf import decoder_layers
from ampkit.plan.describe import describe_model
from ampkit.plan.describe.hf import HFDescription, count_parameters, experts_per_token, has_analytic
from hf_archs import MOE_TYPES, TINY, save_tiny, tiny_config

transformers = pytest.importorskip("transformers")

ANALYTIC_TYPES = {"llama", "mistral", "qwen2", "gpt2", "opt"}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_count_equals_transformers_for_every_architecture(tmp_path, model_type):
    save_tiny(tmp_path, model_type)
    desc = describe_model(f"hf:{tmp_path}")
    assert isinstance(desc, HFDescription) and desc.model_type == model_type
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(model_type))
    assert desc.num_parameters() == model.num_parameters()
    distinct = {id(p): p.numel() for p in model.parameters()}  # a tied head counted once
    assert Counter(desc.parameter_tensors()) == Counter(distinct.values())
    assert has_analytic(desc) == (model_type in ANALYTIC_TYPES)
    if model_type in MOE_TYPES:
        assert desc.counts.experts == 4 and desc.counts.experts_per_token == 2
        assert desc.active_parameters() == desc.num_parameters() - desc.counts.expert_parameters // 2
    else:
        assert desc.active_parameters() == desc.num_parameters() and desc.counts.experts == 0
    lookup = sum(p.numel() for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters())
    head = desc.vocab_size * desc.d_model if desc.tie_embeddings else 0
    assert desc.matmul_parameters() == desc.active_parameters() - lookup + head


def test_moe_layers_differ_from_dense_ones(tmp_path):
    save_tiny(tmp_path, "deepseek_v3", layers=6)  # first_k_dense_replace = 1: a dense layer, then MoE ones
    desc = describe_model(f"hf:{tmp_path}")
    assert desc.pattern.prefix == 1 and desc.pattern.period == 1 and desc.pattern.repeats == 5
    assert "1 leading layer" in desc.pattern.describe()
    assert len(set(desc.counts.layer_parameters)) == 2


def test_experts_per_token_spellings_and_unknown_k_counts_every_expert():
    assert experts_per_token(SimpleNamespace(num_experts_per_tok=2)) == 2
    assert experts_per_token(SimpleNamespace(moe_topk=3)) == 3
    assert experts_per_token(SimpleNamespace()) is None
    config = tiny_config("mixtral")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    counts = count_parameters(model, SimpleNamespace(), decoder_layers(model))  # no experts-per-token field
    assert counts.experts == 4 and counts.experts_per_token == 0 and counts.active == counts.total


def test_unbuildable_config_is_one_line_naming_the_file(tmp_path):
    save_tiny(tmp_path, "llama", pad_token_id=300)  # outside the 256-token vocabulary
    with pytest.raises(UsageError) as err:
        describe_model(f"hf:{tmp_path}")
    text = str(err.value)
    assert str(tmp_path / "config.json") in text and "Padding_idx" in text and "\n" not in text


def test_missing_shape_fields_are_refused_for_any_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64}))
    with pytest.raises(UsageError, match="num_hidden_layers, num_attention_heads, intermediate_size"):
        describe_model(str(tmp_path))


# -- published counts ------------------------------------------------------------------------------
LLAMA2_7B = dict(
    model_type="llama",
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    vocab_size=32000,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
LLAMA3_8B = dict(
    LLAMA2_7B,
    intermediate_size=14336,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    bos_token_id=128000,
    eos_token_id=128001,
)
MISTRAL_7B = dict(LLAMA3_8B, model_type="mistral", vocab_size=32000, max_position_embeddings=32768, rope_theta=1e6)
MISTRAL_7B.update(bos_token_id=1, eos_token_id=2, sliding_window=None)
QWEN25_05B = dict(
    model_type="qwen2",
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    bos_token_id=151643,
    eos_token_id=151643,
)
GPT2 = dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257)
MIXTRAL_8X7B = dict(
    MISTRAL_7B,
    model_type="mixtral",
    num_local_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=32768,
)
GEMMA_7B = dict(
    model_type="gemma",
    hidden_size=3072,
    intermediate_size=24576,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=16,
    head_dim=256,
    vocab_size=256000,
    max_position_embeddings=8192,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)
PHI_2 = dict(
    model_type="phi",
    hidden_size=2560,
    intermediate_size=10240,
    num_hidden_layers=32,
    num_attention_heads=32,
    vocab_size=51200,
    max_position_embeddings=2048,
    partial_rotary_factor=0.4,
    bos_token_id=50256,
    eos_token_id=50256,
)
FALCON_7B = dict(
    model_type="falcon",
    hidden_size=4544,
    num_hidden_layers=32,
    num_attention_heads=71,
    multi_query=True,
    parallel_attn=True,
    bias=False,
    new_decoder_architecture=False,
    vocab_size=65024,
    bos_token_id=11,
    eos_token_id=11,
)
PYTHIA_1B = dict(
    model_type="gpt_neox",
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=8,
    rotary_pct=0.25,
    vocab_size=50304,
    max_position_embeddings=2048,
    use_parallel_residual=True,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=0,
)
QWEN3_30B_A3B = dict(
    model_type="qwen3_moe",
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    vocab_size=151936,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    bos_token_id=151643,
    eos_token_id=151645,
)

# name -> (config, published total, published active or None)
PUBLISHED = {
    "Llama-2-7B": (LLAMA2_7B, 6_738_415_616, None),
    "Llama-3-8B": (LLAMA3_8B, 8_030_261_248, None),
    "Mistral-7B": (MISTRAL_7B, 7_241_732_096, None),
    "Qwen2.5-0.5B": (QWEN25_05B, 494_032_768, None),
    "GPT-2": (GPT2, 124_439_808, None),
    "Mixtral-8x7B": (MIXTRAL_8X7B, 46_702_792_704, 12.9e9),
    "Qwen3-30B-A3B": (QWEN3_30B_A3B, 30_532_122_624, 3.3e9),
    "Gemma-7B": (GEMMA_7B, 8_537_680_896, None),
    "Phi-2": (PHI_2, 2_779_683_840, None),
    "Falcon-7B": (FALCON_7B, 6_921_720_704, None),
    "Pythia-1B": (PYTHIA_1B, 1_011_781_632, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_counts(tmp_path, name):
    config, total, active = PUBLISHED[name]
    (tmp_path / "config.json").write_text(json.dumps(config))
    desc = describe_model(f"hf:{tmp_path}")
    assert desc.num_parameters() == total, name
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    assert model.num_parameters() == total  # transformers' own count, on the meta device
    if active is None:
        assert desc.active_parameters() == total
    else:
        assert abs(desc.active_parameters() - active) <= 0.02 * active  # the card's rounded "12.9B active"
        assert desc.matmul_parameters() < desc.active_parameters()


def test_mixtral_active_parameters_exactly():
    config = transformers.AutoConfig.for_model(**MIXTRAL_8X7B)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    counts = count_parameters(model, config, decoder_layers(model))
    per_expert = 3 * 4096 * 14336
    assert counts.expert_parameters == 32 * 8 * per_expert
    assert counts.active == 46_702_792_704 - 32 * 6 * per_expert == 12_879_925_248
