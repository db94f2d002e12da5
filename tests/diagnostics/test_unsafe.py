"""ampkit.diagnostics.unsafe: the deliberately fp16-unsafe gate and its insertion into a model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.diagnostics.unsafe import NaiveExpGate, insert_unsafe_op
from ampkit.errors import UsageError
from ampkit.models import build_model, get_preset


def _gate() -> NaiveExpGate:
    torch.manual_seed(0)
    gate = NaiveExpGate(nn.Identity(), 8, gain=1.0)
    nn.init.constant_(gate.score.weight, 1.0)  # every score = sum(x): easy to steer past e^11.09
    return gate


def test_the_gate_is_finite_in_fp32_and_nan_in_fp16_once_scores_pass_11():
    x = torch.full((1, 8), 1.5)  # scores 12: e^12 overflows fp16, not fp32
    assert torch.isfinite(_gate()(x)).all()
    assert torch.isnan(_gate().half()(x.half())).all()  # inf / inf


def test_insert_wraps_the_module_at_the_path_with_the_models_width():
    model = build_model(get_preset("tiny"), seed=0)
    mlp = model.blocks[1].mlp
    assert insert_unsafe_op(model, "blocks.1.mlp") is model
    gate = model.blocks[1].mlp
    assert isinstance(gate, NaiveExpGate) and gate.inner is mlp
    assert gate.score.in_features == get_preset("tiny").d_model
    assert gate.score.weight.dtype == mlp.up_proj.weight.dtype


def test_a_model_without_a_config_is_refused():
    with pytest.raises(UsageError, match="config.d_model"):
        insert_unsafe_op(nn.Sequential(nn.Linear(2, 2)), "0")
