"""ampkit.precision.base: the fp32/tf32 policy, whose defaults every regime builds on."""

from __future__ import annotations

import pytest
import torch

from ampkit.precision.base import Precision
from ampkit.precision.table import get_spec


def _flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize(("name", "tf32"), [("fp32", False), ("tf32", True)])
def test_run_context_sets_both_tf32_switches_and_restores_them_on_error(name, tf32):
    before = _flags()
    policy = Precision(get_spec(name), device_type="cpu")
    with pytest.raises(RuntimeError, match="inside"):
        with policy.run_context():
            assert _flags() == (tf32, tf32)
            raise RuntimeError("inside")
    assert _flags() == before


def test_fp32_steps_every_time_and_keeps_no_state():
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    policy = Precision(get_spec("fp32"), device_type="cpu")
    assert policy.name == "fp32" and policy.convert_module(torch.nn.Identity()).__class__ is torch.nn.Identity
    with policy.forward_context():
        loss = (param * 2).sum()
    policy.backward(loss)
    policy.unscale_gradients(optimizer)  # nothing to unscale
    assert policy.optimizer_step(optimizer) is True
    assert param.tolist() == [-1.0, -1.0]
    assert policy.loss_scale() is None and policy.state_dict() == {}
