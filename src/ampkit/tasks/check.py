"""A user's task, checked on one batch before any training: a mistake in it is one line naming the
task and the problem (exit 2), not a traceback halfway into a run.

Checked: the batch's `.to(device)` puts every tensor on the run's device; `count` gives host ints
with 0 < items <= slots; `loss` runs and returns a finite 0-d tensor (the mean over the batch's
items), and the accuracy (a classification's) reads its outputs. One forward under the run's
precision (its inputs converted as the step converts them), no gradient: the model's weights are
untouched (a BatchNorm's running statistics would move in train mode, so the check runs in eval mode).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ampkit.core.counts import Counts, as_counts
from ampkit.core.step import policy_loss
from ampkit.errors import UsageError
from ampkit.tasks import optional
from ampkit.tasks.optional import tensors_of


def _same_device(tensor: torch.Tensor, device: torch.device) -> bool:
    return tensor.device.type == device.type and (device.index is None or tensor.device.index == device.index)


def check_batch_device(task, batch: Any, device: torch.device) -> Any:
    """`batch.to(device)`, refused when a tensor stays elsewhere; returns the moved batch."""
    moved = batch.to(device)
    stray = [t.device for t in tensors_of(moved) if not _same_device(t, device)]
    if stray:
        raise UsageError(
            f"task {task.name}: a batch moved with .to({device}) still has a tensor on {stray[0]}; its .to() must "
            "move every tensor it holds"
        )
    return moved


def check_counts(task, batch: Any) -> Counts:
    """The task's count of `batch` (`Counts`, or an older task's (items, slots) pair), checked:
    host ints, 0 < trained <= processed <= slots."""
    value = task.count(batch)
    try:
        counts = as_counts(value)
    except (TypeError, ValueError):
        counts = None
    numbers = [counts.trained, counts.processed, counts.slots] if counts is not None else []
    ints = bool(numbers) and all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)
    if not ints or not 0 < numbers[0] <= numbers[1] <= numbers[2]:
        raise UsageError(
            f"task {task.name}: count(batch) must give two ints, 0 < items <= slots, or ampkit.core.counts.Counts, "
            f"0 < trained <= processed <= slots (host values, no tensors), got {value!r}"
        )
    assert counts is not None
    return counts


def check_loss(task, model: nn.Module, batch: Any, *, policy, finite: bool = True) -> float:
    """The loss of one batch under the run's precision; refused unless it is a 0-d tensor, and finite
    (`finite=False`: doctor, for whom a loss non-finite in the diagnosed precision is the finding)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), policy.run_context():
            loss, outputs = one_line(
                task, "loss failed on the first batch", lambda: policy_loss(policy, task.loss, model, batch)
            )
            one_line(task, "accuracy failed on the first batch", lambda: optional.accuracy(task, outputs, batch))
    finally:
        model.train(was_training)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UsageError(f"task {task.name}: loss must return a 0-d tensor (the mean over the batch), got {shape}")
    value = float(loss.detach().float())  # sync point: once, before training
    if finite and not math.isfinite(value):
        raise UsageError(
            f"task {task.name}: the loss of the first batch is not finite ({value}) at the initial weights; check "
            "the data and the loss before choosing a precision"
        )
    return value


def one_line(task, failed: str, call: Callable[[], Any]) -> Any:
    """`call()`, where an error comes from the user's code (its model, loss or accuracy): one line naming
    the task, "task NAME: its FAILED: Error: first line of the message" (exit 2), not a traceback."""
    try:
        return call()
    except UsageError:
        raise
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0][:240]
        raise UsageError(f"task {task.name}: its {failed}: {type(err).__name__}: {first}") from None


def check_first_batch(
    task, model: nn.Module, batch: Any, *, device: torch.device, policy, finite: bool = True
) -> float:
    """All three checks on one batch; returns its loss (`finite`: see `check_loss`)."""
    moved = check_batch_device(task, batch, device)
    check_counts(task, moved)
    return check_loss(task, model, moved, policy=policy, finite=finite)
