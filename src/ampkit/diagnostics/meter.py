"""What the per-step meters over a model's trainable parameters share (`gradstats.GradientStatistics`,
`underflow.UpdateUnderflowMeter`): the trainable parameters and their names, arming every `every`
steps with that step's loss scale, and removing the hooks the meter's `attach` registered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


class ParameterMeter:
    """The trainable parameters of `model` (names and tensors, in `named_parameters` order) and the
    per-step arming. `begin_step(step)` before each step arms it when `step % every == 0` and reads
    `scale_fn` (the loss scale the coming backward uses, a host value: no sync; None means no
    scaling, 1.0). A subclass's `attach` fills `_handles`; `detach` removes them."""

    def __init__(self, model: nn.Module, *, every: int, scale_fn: Callable[[], float | None]):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.every, self.scale_fn = every, scale_fn
        self._armed, self._step, self._scale = False, 0, 1.0
        self._handles: list[Any] = []

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def begin_step(self, step: int) -> None:
        self._armed = step % self.every == 0
        self._step, self._scale = step, float(self.scale_fn() or 1.0)
