"""One diagnosed training step, as doctor's own run and its replay of a train run (`replay.py`) take it.

The step through `Trainer.train_step`; a collapsed loss scale ends the window (recorded on the loss-scale
trajectory, the last located overflow then the finding); else the loss and gradient norm read to the host
(one sync a step: a diagnosis, not a training run), the scale trajectory and the step's gradient
statistics recorded, and a backward inf on a step the scaler skipped with a finite loss absorbed: the
scaler doing its job, noted as an overflow, the locator looking on.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch

from ampkit.diagnostics.gradstats import GradientStatistics, StepGradStats
from ampkit.diagnostics.locator import Finding, NonFiniteLocator
from ampkit.diagnostics.scale import ScaleTrajectory
from ampkit.precision import LossScaleCollapse


class StepRecord(Protocol):
    """What a diagnosed step writes to (doctor's `RunRecord`, a replay's `ReplayPass`)."""

    losses: list[float]
    grad_norms: list[float]
    grad_stats: list[StepGradStats]
    trajectory: ScaleTrajectory
    scaler_overflows: list[Finding]
    error: str | None


def diagnosed_step(
    trainer, policy, locator: NonFiniteLocator, stats: GradientStatistics, record: StepRecord, step: int
) -> tuple[Any, float] | None:
    """Step `step` into `record` (module docstring): (the step's result, its loss), or None when the loss
    scale collapsed (the window ends there)."""
    try:
        result = trainer.train_step()
    except LossScaleCollapse as err:
        record.trajectory.record_collapse(step, policy.loss_scale())
        record.error = str(err)
        if locator.first_nonfinite is None and record.scaler_overflows:
            locator.first_nonfinite = record.scaler_overflows[-1]  # never absorbed: it kept overflowing
        return None
    loss, norm = torch.stack([result.loss.float(), result.grad_norm.float()]).tolist()  # sync: a diagnosis
    record.losses.append(loss)
    record.grad_norms.append(norm)
    record.trajectory.record(step, policy.loss_scale(), stepped=result.stepped)
    record.grad_stats.extend(stats.drain())
    finding = locator.first_nonfinite
    if finding is not None and finding.phase == "backward" and not result.stepped and math.isfinite(loss):
        record.scaler_overflows.append(finding)  # the loss scaler's own overflow handling: keep looking
        locator.resume()
    return result, loss
