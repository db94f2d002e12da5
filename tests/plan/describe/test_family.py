"""ampkit.plan.describe.family: one object per block family, read instead of the family's name."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from ampkit.plan.analytic.blocks import SCRIPTS
from ampkit.plan.analytic.fp8 import block_linears
from ampkit.plan.describe import describe_config, describe_model
from ampkit.plan.describe.family import BLOCK_FAMILIES, GPT2, LLAMA, OPT, OTHER, block_family
from ampkit.plan.describe.model import FAMILIES

PLAN = Path(__file__).resolve().parents[3] / "src" / "ampkit" / "plan"
GPT2_CONFIG = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 50, "n_positions": 64}
OPT_CONFIG = {
    "model_type": "opt",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "ffn_dim": 64,
    "vocab_size": 50,
    "max_position_embeddings": 64,
    "word_embed_proj_dim": 32,
}


def test_every_formula_family_has_its_object_and_a_ledger_script():
    assert set(BLOCK_FAMILIES) == set(FAMILIES)
    assert all(family.script in SCRIPTS for family in (*BLOCK_FAMILIES.values(), OTHER))
    assert block_family("mixtral") is OTHER  # a transformers architecture without formulas


@pytest.mark.parametrize(
    ("desc", "family"),
    [(describe_model("tiny"), LLAMA), (describe_config(GPT2_CONFIG), GPT2), (describe_config(OPT_CONFIG), OPT)],
)
def test_a_description_carries_its_familys_object(desc, family):
    assert desc.block is family
    # the formulas read it: a gated MLP has three matrices, an ungated two
    assert len(desc.matmul_weights_per_block()) == 4 + family.mlp_matrices


def test_the_family_objects_say_what_their_blocks_are_made_of():
    assert (LLAMA.rope, LLAMA.gated_mlp, LLAMA.fused_qkv, LLAMA.lora_targets) == (True, True, False, True)
    assert (GPT2.rope, GPT2.gated_mlp, GPT2.fused_qkv, GPT2.fp8_linears) == (False, False, True, ())
    assert (OPT.rope, OPT.gated_mlp, OPT.fused_qkv, OPT.script) == (False, False, False, "gpt")


def test_fp8_reads_the_blocks_linears_from_the_family():
    opt = describe_config(OPT_CONFIG)
    assert block_linears(opt) == [
        ("q_proj", 32, 32),
        ("k_proj", 32, 32),
        ("v_proj", 32, 32),
        ("out_proj", 32, 32),
        ("fc1", 32, 64),
        ("fc2", 64, 32),
    ]
    assert block_linears(describe_config(GPT2_CONFIG)) is None  # Conv1D: float8 converts none
    tiny = describe_model("tiny")
    names = [name for name, _, _ in block_linears(tiny) or []]
    assert names == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # a family object, not a name test: the same shape under another family's object plans that family's way
    assert block_linears(replace(tiny, family="gpt2")) is None


def test_no_plan_module_tests_a_familys_name():
    pattern = re.compile(r"\.family\s*(==|!=|in\b)")
    hits = [
        f"{path.relative_to(PLAN)}:{n}"
        for path in sorted(PLAN.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, f"test the BlockFamily object's facts instead: {', '.join(hits)}"
