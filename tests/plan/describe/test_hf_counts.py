"""The planner's formulas against transformers' own modules: for tiny configs of every family the
planner parses, its parameter count equals `model.num_parameters()`, tensor by tensor; `ampkit plan
--model hf:PATH` reports it; and the N of 6N agrees with the one bench uses for the same model."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from ampkit.cli import main
from ampkit.models.hf import describe_hf_model
from ampkit.plan.describe import describe_model
from hf_fixtures import make_tiny_gpt2, make_tiny_llama

transformers = pytest.importorskip("transformers")  # the optional `ampkit[hf]` extra

SMALL = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
CONFIGS = {
    "llama": lambda path: make_tiny_llama(path),
    "llama-tied-mlp-bias": lambda path: make_tiny_llama(
        path, tie_word_embeddings=True, mlp_bias=True, attention_bias=True
    ),
    "gpt2": lambda path: make_tiny_gpt2(path, tokenizer=False),
    "mistral": lambda path: transformers.MistralConfig(
        **SMALL, intermediate_size=64, num_key_value_heads=2
    ).save_pretrained(path),
    "qwen2": lambda path: transformers.Qwen2Config(
        **SMALL, intermediate_size=64, num_key_value_heads=2, tie_word_embeddings=False
    ).save_pretrained(path),
    "opt": lambda path: transformers.OPTConfig(
        **SMALL, ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32
    ).save_pretrained(path),
}


def transformers_model(path):
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    return transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_planner_count_equals_transformers(tmp_path, family):
    CONFIGS[family](tmp_path)
    desc = describe_model(f"hf:{tmp_path}")
    model = transformers_model(tmp_path)
    assert desc.num_parameters() == model.num_parameters()
    distinct = {id(p): p.numel() for p in model.parameters()}  # a tied head counted once
    assert Counter(desc.parameter_tensors()) == Counter(distinct.values())
    info = describe_hf_model(f"hf:{tmp_path}")  # what train and bench count (on the meta device)
    assert info.num_parameters() == desc.num_parameters()
    head = info.vocab_size * info.d_model if info.tie_embeddings else 0  # a tied head still multiplies
    assert info.num_parameters(include_embedding=False) + head == desc.matmul_parameters()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_plan_cli_accepts_hf_folders(tmp_path, capsys, family):
    CONFIGS[family](tmp_path / "model")
    code = main(
        [
            "plan",
            "--model",
            f"hf:{tmp_path / 'model'}",
            "--gpu",
            "A100-80GB",
            "--precisions",
            "fp32,bf16-mixed",
            "--seq-len",
            "64",
            "--json",
            "--out",
            str(tmp_path / "plan"),
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"]["num_parameters"] == transformers_model(tmp_path / "model").num_parameters()
    assert summary["model"]["family"] == family and summary["rows"]
