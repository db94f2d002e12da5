"""ampkit.diagnostics.diagnosed_step: the step doctor's run and its replay share (the finite path runs in
every doctor test); here the window's end at a collapsed loss scale."""

from __future__ import annotations

from torch import nn

from ampkit.diagnostics.diagnosed_step import diagnosed_step
from ampkit.diagnostics.doctor import RunRecord
from ampkit.diagnostics.locator import Finding, NonFiniteLocator
from ampkit.diagnostics.replay import ReplayPass
from ampkit.precision import LossScaleCollapse


class _CollapsingTrainer:
    def train_step(self):
        raise LossScaleCollapse("loss scale 1e-4 below its floor")


class _Policy:
    def loss_scale(self) -> float:
        return 1e-4


def _overflow(step: int) -> Finding:
    return Finding(
        kind="nonfinite", module="blocks.0", cls="Linear", phase="backward", site="output", step=step,
        values="inf", explanation="a backward inf the scaler skipped",
    )  # fmt: skip


def test_a_collapsed_scale_ends_the_window_and_its_last_overflow_is_the_finding():
    for record in (RunRecord(), ReplayPass()):  # doctor's record and a replay's take the same step
        locator = NonFiniteLocator(nn.Linear(2, 2))
        record.scaler_overflows.append(_overflow(3))
        assert diagnosed_step(_CollapsingTrainer(), _Policy(), locator, None, record, 4) is None
        assert record.error == "loss scale 1e-4 below its floor" and record.trajectory.collapsed_at == 4
        assert locator.first_nonfinite is record.scaler_overflows[-1] and record.losses == []
