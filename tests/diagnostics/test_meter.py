"""The meters' shared part (`ampkit.diagnostics.meter`): trainable parameters only, arming every
`every` steps with that step's loss scale, and hooks removed on detach."""

from __future__ import annotations

import torch
from torch import nn

from ampkit.diagnostics.gradstats import GradientStatistics
from ampkit.diagnostics.meter import ParameterMeter
from ampkit.diagnostics.underflow import UpdateUnderflowMeter


def _model() -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model[0].bias.requires_grad_(False)
    return model


def test_only_trainable_parameters_in_named_parameters_order():
    meter = ParameterMeter(_model(), every=1, scale_fn=lambda: None)
    assert meter.names == ["0.weight", "1.weight", "1.bias"]
    assert [p.shape for p in meter.params] == [(3, 3), (1, 3), (1,)]


def test_armed_every_n_steps_with_that_steps_scale():
    scales = iter([None, 1024.0, 512.0])
    meter = ParameterMeter(_model(), every=2, scale_fn=lambda: next(scales))
    meter.begin_step(1)
    assert (meter._armed, meter._step, meter._scale) == (False, 1, 1.0)  # None: no scaling
    meter.begin_step(2)
    assert (meter._armed, meter._step, meter._scale) == (True, 2, 1024.0)
    meter.begin_step(4)
    assert (meter._armed, meter._scale) == (True, 512.0)


class _Handle:
    removed = 0

    def remove(self) -> None:
        _Handle.removed += 1


def test_detach_removes_every_handle_once():
    meter = ParameterMeter(_model(), every=1, scale_fn=lambda: None)
    meter._handles = [_Handle(), _Handle()]
    meter.detach()
    meter.detach()
    assert _Handle.removed == 2 and meter._handles == []


def test_both_meters_share_it():
    model = nn.Linear(2, 2)
    assert isinstance(GradientStatistics(model), ParameterMeter)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert isinstance(UpdateUnderflowMeter(model, optimizer), ParameterMeter)
