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


def _bf16_weight(value: float = 1.0, n: int = 4096) -> nn.Module:
    """One bf16 weight of `n` elements at `value` (bf16's spacing at 1.0 is 2^-7 = 0.0078)."""
    model = nn.Linear(n, 1, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


def _steps(name: str, model: nn.Module, *, lr: float, steps: int) -> torch.Tensor:
    """`steps` AdamW steps with a constant gradient of 1: each moves a weight by ~lr (Adam's step is ~lr)."""
    optimizer = build_optimizer(model, name=name, lr=lr, weight_decay=0.0)
    for _ in range(steps):
        model.weight.grad = torch.ones_like(model.weight)
        optimizer.step()
    return model.weight.detach().float()


@pytest.mark.parametrize("name", ["adamw-sr", "adamw-kahan"])
def test_bf16_updates_below_half_an_ulp_are_kept(name):
    """A 1e-3 step on a bf16 weight at 1.0 is an eighth of bf16's spacing there: plain AdamW rounds it
    away every time; stochastic rounding keeps it in expectation, Kahan summation in a compensation."""
    lr, steps = 1e-3, 20  # expected total move: -0.02 (Adam's steps are ~lr with a constant gradient)
    plain = _steps("adamw", _bf16_weight(), lr=lr, steps=steps)
    assert torch.equal(plain, torch.ones_like(plain))  # every update lost to rounding
    kept = _steps(name, _bf16_weight(), lr=lr, steps=steps)
    assert kept.dtype == torch.float32 and (kept != 1.0).any()
    assert kept.mean().item() == pytest.approx(1.0 - lr * steps, abs=0.005)


def test_the_sr_and_kahan_states_are_the_bytes_the_planner_counts():
    """adamw-sr: two moments in the weight's dtype; adamw-kahan: plus a compensation buffer (plan/optim.py)."""
    from ampkit.plan.optim import optimizer_state_bytes

    for name in ("adamw-sr", "adamw-kahan"):
        model = _bf16_weight(n=1024)
        optimizer = build_optimizer(model, name=name, lr=1e-3, weight_decay=0.0)
        model.weight.grad = torch.ones_like(model.weight)
        optimizer.step()
        tensors = [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
        held = sum(t.numel() * t.element_size() for t in tensors)  # step counters included, as the planner does
        assert held == optimizer_state_bytes(name, [model.weight.numel()], param_bytes=2), name
