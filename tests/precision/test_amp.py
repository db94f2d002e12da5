"""ampkit.precision.amp: autocast regimes, the fp16 loss scaler and its floor, the -true regimes."""

from __future__ import annotations

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.precision.amp import AutocastPrecision, LossScaleCollapse, ScalerConfig, TruePrecision
from ampkit.precision.table import get_spec


def _step(policy: AutocastPrecision, grad_value: float) -> bool:
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    with policy.forward_context():
        loss = (param * grad_value).sum()
    policy.backward(loss)
    policy.unscale_gradients(optimizer)
    return policy.optimizer_step(optimizer)


def test_bf16_mixed_autocasts_matmuls_and_has_no_scale():
    policy = AutocastPrecision(get_spec("bf16-mixed"), device_type="cpu")
    with policy.forward_context():
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16
    assert policy.loss_scale() is None and _step(policy, 1.0) is True


def test_fp16_scaler_skips_an_overflowing_step_and_backs_off():
    policy = AutocastPrecision(get_spec("fp16-mixed"), device_type="cpu", scaler=ScalerConfig(init_scale=1024.0))
    assert _step(policy, 1.0) is True and policy.loss_scale() == 1024.0
    assert _step(policy, float("inf")) is False and policy.loss_scale() == 512.0
    restored = AutocastPrecision(get_spec("fp16-mixed"), device_type="cpu")
    restored.load_state_dict(policy.state_dict())
    assert restored.loss_scale() == 512.0


def test_a_scale_below_the_floor_stops_the_run():
    policy = AutocastPrecision(
        get_spec("fp16-mixed"), device_type="cpu", scaler=ScalerConfig(init_scale=2.0, min_scale=1.5)
    )
    with pytest.raises(LossScaleCollapse, match="below min_scale 1.5"):
        _step(policy, float("nan"))


@pytest.mark.parametrize(
    "bad",
    [{"init_scale": 0}, {"growth_factor": 1.0}, {"backoff_factor": 1.0}, {"growth_interval": 0}, {"min_scale": -1}],
)
def test_scaler_knobs_are_checked(bad):
    with pytest.raises(UsageError):
        ScalerConfig(**bad)


def test_true_regimes_store_the_weights_in_16_bits():
    model = TruePrecision(get_spec("bf16-true"), device_type="cpu").convert_module(torch.nn.Linear(2, 2))
    assert model.weight.dtype == torch.bfloat16
