"""A module's backward seen without module backward hooks (safe with models that modify outputs in place).

`register_full_backward_hook` wraps a module's *outputs* (and inputs) in a `BackwardHookFunction`,
which makes them views; a model that then modifies an output in place, as Falcon's decoder layer
does (`mlp_output += attention_output`), fails in its forward: "Output 0 of BackwardHookFunction
is a view and is being modified inplace". The two halves are observed here instead:
- the gradient arriving at a module's outputs: a tensor hook on each output (`hook_outputs`),
  registered in a forward hook; an output modified in place later still reports the gradient of
  the value the module returned (hooks stay with the version they were registered on);
- the gradient a module sends to its inputs: its positional floating-point inputs that need a
  gradient pass through `_InputProbe`, an identity autograd function applied in a forward
  pre-hook (`probe_inputs`); its backward sees exactly this module's contribution to each input's
  gradient (an input used elsewhere too gets its other contributions elsewhere), and may replace
  it (fault injection). Only the inputs are wrapped, as `BackwardHookFunction` also wraps them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

GradCallback = Callable[[tuple[torch.Tensor | None, ...]], tuple[torch.Tensor | None, ...] | None]


class _InputProbe(torch.autograd.Function):
    """Identity in forward; in backward, `callback(grads)` sees (and may replace) the gradients."""

    @staticmethod
    def forward(ctx, callback: GradCallback, *tensors: torch.Tensor):
        ctx.callback = callback
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        replaced = ctx.callback(grads)
        return (None, *(replaced if replaced is not None else grads))


def _needs_grad(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad


def probe_inputs(args: tuple, callback: GradCallback) -> tuple | None:
    """`args` with its floating inputs that need a gradient passed through the probe (None: none do,
    so the module's backward sends nothing upstream)."""
    where = [i for i, a in enumerate(args) if _needs_grad(a)]
    if not where or not torch.is_grad_enabled():
        return None
    probed = _InputProbe.apply(callback, *(args[i] for i in where))
    out = list(args)
    for i, tensor in zip(where, probed):
        out[i] = tensor
    return tuple(out)


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def hook_outputs(output: Any, callback: Callable[[torch.Tensor], None]) -> int:
    """A tensor hook on every floating output that needs a gradient; returns how many were hooked."""
    hooked = 0
    for tensor in _tensors(output):
        if _needs_grad(tensor):
            tensor.register_hook(callback)
            hooked += 1
    return hooked
