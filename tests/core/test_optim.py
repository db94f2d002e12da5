"""ampkit.core.optim: the one optimizer factory (weight-decay groups, names, hyperparameters)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.core.optim import ADAMW_BETAS, ADAMW_EPS, OPTIMIZERS, build_optimizer, param_groups
from ampkit.errors import UsageError


def _model() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2, bias=False))
    model[0].bias.requires_grad_(False)  # frozen: in no group
    return model


def test_matrices_are_decayed_and_vectors_are_not():
    model = _model()
    decayed, plain = param_groups(model, weight_decay=0.1)
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert {id(p) for p in decayed["params"]} == {id(model[0].weight), id(model[2].weight)}
    assert {id(p) for p in plain["params"]} == {id(model[1].weight), id(model[1].bias)}


def test_adamw_and_sgd_get_the_shared_hyperparameters():
    adamw = build_optimizer(_model(), name="adamw", lr=1e-3, weight_decay=0.1)
    assert isinstance(adamw, torch.optim.AdamW)
    assert adamw.defaults["betas"] == ADAMW_BETAS and adamw.defaults["eps"] == ADAMW_EPS
    assert adamw.defaults["fused"] is True
    assert [g["weight_decay"] for g in adamw.param_groups] == [0.1, 0.0]
    sgd = build_optimizer(_model(), name="sgd", lr=0.5, weight_decay=0.0, momentum=0.8)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.8 and sgd.defaults["lr"] == 0.5


def test_unknown_optimizer_lists_the_choices():
    with pytest.raises(UsageError) as err:
        build_optimizer(_model(), name="lion", lr=1e-3, weight_decay=0.0)
    assert all(name in str(err.value) for name in OPTIMIZERS)
