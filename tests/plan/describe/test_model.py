"""Model descriptions: exact parameter counts against the models actually built."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.models import PRESETS, LlamaLM
from ampkit.plan.describe import describe_config, describe_model


def built_count(module: nn.Module) -> int:
    """Distinct parameters of a built module (a tied weight once)."""
    return sum(p.numel() for p in module.parameters())


def meta_llama(cfg) -> LlamaLM:
    with torch.device("meta"):  # shapes only: a 70B model costs nothing
        return LlamaLM(cfg)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_counts_match_the_built_model(name):
    desc = describe_model(name)
    assert desc.num_parameters() == built_count(meta_llama(desc.model_config))
    assert desc.num_parameters() == PRESETS[name].num_parameters()


LLAMA_GQA = {  # a small Llama-3-style config with grouped-query attention and a tied head
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 688,
    "vocab_size": 1000,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
    "rope_theta": 500000.0,
}


def test_hf_llama_gqa_config_counts_the_built_model():
    desc = describe_config(LLAMA_GQA)
    assert desc.buildable and desc.n_kv_heads == 2 and desc.kv_dim == 64
    assert desc.num_parameters() == built_count(meta_llama(desc.model_config))


def test_untied_llama_adds_exactly_the_head():
    tied = describe_config(LLAMA_GQA)
    untied = describe_config({**LLAMA_GQA, "tie_word_embeddings": False})
    assert untied.num_parameters() - tied.num_parameters() == 1000 * 256
    assert untied.num_parameters() == built_count(meta_llama(untied.model_config))


def test_qwen2_counts_qkv_biases_only():
    plain = describe_config({**LLAMA_GQA, "model_type": "mistral"})
    qwen = describe_config({**LLAMA_GQA, "model_type": "qwen2"})
    assert qwen.qkv_bias and not qwen.out_bias and not qwen.buildable
    assert qwen.num_parameters() - plain.num_parameters() == 3 * (256 + 2 * 64)


class TinyGPT2(nn.Module):
    """A hand-built GPT-2 (the HF module layout: wte, wpe, ln_1, c_attn, c_proj, ln_2, c_fc,
    c_proj, ln_f, tied lm_head) to count against, without transformers."""

    def __init__(self, *, vocab: int, positions: int, d: int, layers: int, inner: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln_1": nn.LayerNorm(d),
                    "c_attn": nn.Linear(d, 3 * d),
                    "attn_proj": nn.Linear(d, d),
                    "ln_2": nn.LayerNorm(d),
                    "c_fc": nn.Linear(d, inner),
                    "mlp_proj": nn.Linear(inner, d),
                }
            )
            for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight


@pytest.mark.parametrize("inner", [None, 80])
def test_gpt2_counts_a_hand_built_gpt2(inner):
    config = {
        "model_type": "gpt2",
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 101,
        "n_positions": 64,
        "n_inner": inner,
    }
    desc = describe_config(config)
    reference = TinyGPT2(vocab=101, positions=64, d=32, layers=2, inner=inner or 4 * 32)
    assert desc.num_parameters() == built_count(reference)
    assert not desc.buildable and desc.tie_embeddings


def test_gpt2_small_published_count():
    config = {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
    }
    assert describe_config(config).num_parameters() == 124_439_808


def test_opt_125m_published_count():
    config = {
        "model_type": "opt",
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "ffn_dim": 3072,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
        "word_embed_proj_dim": 768,
        "do_layer_norm_before": True,
    }
    desc = describe_config(config)
    assert desc.position_rows == 2050  # learned positions start at offset 2
    assert desc.num_parameters() == 125_239_296


def test_opt_with_projection_is_refused_with_the_reason():
    config = {
        "model_type": "opt",
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "ffn_dim": 4096,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
        "word_embed_proj_dim": 512,
    }
    with pytest.raises(UsageError, match="word_embed_proj_dim"):
        describe_config(config)


def test_missing_fields_are_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "vocab_size": 100}))
    with pytest.raises(UsageError, match="num_hidden_layers, num_attention_heads, intermediate_size"):
        describe_model(str(path))


def test_config_path_and_folder_both_work(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_GQA))
    assert describe_model(str(tmp_path)).num_parameters() == describe_config(LLAMA_GQA).num_parameters()


@pytest.mark.parametrize(
    "bad", [{"model_type": "bert"}, {**LLAMA_GQA, "num_key_value_heads": 3}, {**LLAMA_GQA, "hidden_size": -1}]
)
def test_bad_configs_are_user_errors(bad):
    with pytest.raises(UsageError):
        describe_config(bad)
