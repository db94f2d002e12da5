"""`--lora-targets`: the per-family defaults and the patterns (names, globs), with the refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.lora.targets import LLAMA_PROJECTIONS, default_targets, resolve_targets
from ampkit.models import get_preset
from ampkit.models.hf import build_hf_model
from ampkit.models.llama import build_model
from ampkit.tasks.mlp import TinyMLP
from hf_fixtures import hf_dirs  # noqa: F401  (a fixture)

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def tiny() -> nn.Module:
    return build_model(get_preset("tiny", vocab_size=256), seed=0)


def test_builtin_lm_adapts_every_projection(tiny):
    targets = default_targets(tiny)
    assert len(targets.paths) == 4 * 7
    assert targets.names() == list(LLAMA_PROJECTIONS) and "llama projections" in targets.source
    assert "lm_head" not in targets.paths


def test_hf_llama_uses_the_same_names(hf_dirs):
    model = build_hf_model(f"hf:{hf_dirs['llama']}", seed=0)
    targets = default_targets(model)
    assert targets.names() == list(LLAMA_PROJECTIONS)
    assert targets.paths[0] == "hf.model.layers.0.self_attn.q_proj"


def test_hf_gpt2_falls_back_to_peft_default(hf_dirs):
    model = build_hf_model(f"hf:{hf_dirs['gpt2']}", seed=0)
    targets = default_targets(model)
    assert targets.names() == ["c_attn"] and "peft's gpt2 default" in targets.source


def test_any_other_model_adapts_every_linear():
    targets = default_targets(TinyMLP(128, 64, 10))
    assert targets.paths == ["fc1", "fc2"] and targets.source == "every nn.Linear"


def test_patterns_names_and_globs(tiny):
    assert resolve_targets(tiny, ["q_proj", "v_proj"]).paths[:2] == ["blocks.0.attn.q_proj", "blocks.0.attn.v_proj"]
    glob = resolve_targets(tiny, ["blocks.1.mlp.*"]).paths
    assert glob == ["blocks.1.mlp.gate_proj", "blocks.1.mlp.up_proj", "blocks.1.mlp.down_proj"]


def test_a_pattern_matching_nothing_is_refused_with_names(tiny):
    with pytest.raises(UsageError, match="matches no module of LlamaLM; its Linear layers are named like: q_proj"):
        resolve_targets(tiny, ["q_proj", "qproj"])


def test_a_whole_block_is_refused(tiny):
    with pytest.raises(UsageError, match=r"matches blocks.0.attn \(Attention\), which LoRA cannot adapt"):
        resolve_targets(tiny, ["attn"])


def test_a_model_without_linear_layers_is_refused():
    with pytest.raises(UsageError, match="no nn.Linear layer"):
        resolve_targets(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), [])
    assert torch.nn.Conv2d  # convolutions can still be named explicitly
    assert resolve_targets(nn.Sequential(nn.Conv2d(3, 4, 3)), ["0"]).paths == ["0"]
