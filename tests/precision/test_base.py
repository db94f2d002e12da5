"""ampkit.precision.base: the fp32/tf32 policy, whose defaults every regime builds on."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

from ampkit.precision.base import Precision
from ampkit.precision.casting import LOSS_ONLY, cast_floating
from ampkit.precision.table import get_spec


def _flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize(("name", "tf32"), [("fp32", False), ("tf32", True)])
def test_run_context_sets_both_tf32_switches_and_restores_them_on_error(name, tf32):
    before = _flags()
    policy = Precision(get_spec(name), device_type="cpu")
    with pytest.raises(RuntimeError, match="inside"), policy.run_context():
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


def test_cast_floating_casts_floats_anywhere_and_leaves_the_rest():
    @dataclasses.dataclass(frozen=True)
    class Pair:
        x: torch.Tensor
        y: torch.Tensor = dataclasses.field(metadata={LOSS_ONLY: True})

    Row = collections.namedtuple("Row", "features ids")
    batch = {
        "pair": Pair(torch.ones(2), torch.ones(2)),
        "row": Row(torch.ones(2, dtype=torch.float64), torch.arange(2)),
        "list": [torch.zeros(1), torch.ones(1, dtype=torch.bool)],
        "n": 3,
    }
    cast = cast_floating(batch, torch.bfloat16)
    assert cast["pair"].x.dtype == torch.bfloat16 and cast["pair"].y is batch["pair"].y  # only the loss reads y
    assert isinstance(cast["row"], Row) and cast["row"].features.dtype == torch.bfloat16
    assert cast["row"].ids is batch["row"].ids and cast["list"][1] is batch["list"][1]  # ints and masks stay
    assert cast["list"][0].dtype == torch.bfloat16 and cast["n"] == 3
    ints = {"ids": torch.arange(3), "mask": torch.ones(3, dtype=torch.bool), "tag": "x"}
    assert cast_floating(ints, torch.bfloat16) is ints  # nothing to cast: the same object back


def test_the_fp32_policy_passes_its_inputs_as_they_are():
    batch = (torch.ones(2), torch.arange(2))
    assert Precision(get_spec("fp32"), device_type="cpu").convert_input(batch) is batch
