"""The precision interface. Every hook does the plain-fp32 thing by default; each regime overrides
only what differs, so the training loop never asks "is this fp16?".

Building (`ampkit.train.build`): the model is constructed inside `policy.init_context()`, so its
weights are born in their storage dtype, then `policy.convert_module` adapts it (the low-bit formats'
Linear swap, reported by `policy.conversion()`).

Call order in a step (the loop's contract):
    with policy.run_context():                       # once per run: backend flags (TF32)
        batch = policy.convert_input(batch)          # what enters the model: a -true regime's dtype
        with policy.forward_context():               # forward + loss only
            loss = ...
        policy.backward(loss)                        # scale (if any) then backward
        policy.unscale_gradients(optimizer)          # before clipping: clip sees true gradients
        clip_grad_norm_(...)
        stepped = policy.optimizer_step(optimizer)   # False when the scaler skipped the step
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ampkit.precision.convert.report import ConversionReport
from ampkit.precision.table import PrecisionSpec


class Precision:
    """fp32 and tf32: no autocast, no scaling; TF32 flags set from the spec for the run's duration."""

    def __init__(self, spec: PrecisionSpec, *, device_type: str):
        self.spec = spec
        self.device_type = device_type

    @property
    def name(self) -> str:
        return self.spec.name

    @contextlib.contextmanager
    def run_context(self) -> Iterator[None]:
        """Sets both TF32 switches (cuBLAS matmul *and* cuDNN) and restores them on exit, even on error."""
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = self.spec.tf32
        torch.backends.cudnn.allow_tf32 = self.spec.tf32
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

    def init_context(self) -> contextlib.AbstractContextManager:
        """Where the model is constructed (Lightning's `module_init_context`): factory calls inside create
        weights in the dtype they will be stored in. fp32 weights: nothing to change."""
        return contextlib.nullcontext()

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module

    def conversion(self) -> ConversionReport | None:
        """What the last `convert_module` did to the model's Linears (the low-bit regimes: which it
        converted, which it kept and why); None where nothing is converted."""
        return None

    def convert_input(self, batch: Any) -> Any:
        """The batch as the model must receive it (Lightning Fabric's `convert_input`). fp32 weights
        take their inputs as they come (autocast casts inside the forward): unchanged, the same object."""
        return batch

    def forward_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients are already true-scale unless a loss scaler multiplied them."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; return whether it really stepped."""
        optimizer.step()
        return True

    def loss_scale(self) -> float | None:
        """Current loss scale, or None for regimes without loss scaling."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore for stateless regimes."""


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default floating dtype set to `dtype` for the block, restored on exit (even on error)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


LOSS_ONLY = "ampkit.loss_only"
"""Dataclass field metadata key: a batch field that only the loss reads, never the model (a regression
target), which `cast_floating` leaves in its dtype: `targets: Tensor = field(metadata={LOSS_ONLY: True})`."""


def cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """`data` with every floating-point tensor cast to `dtype`, inside tensors, dataclasses, tuples
    (named ones too), lists and dicts; integer and bool tensors (token ids, class labels, masks), fields
    marked `LOSS_ONLY` and any other object stay as they are. Nothing to cast: the same object back."""
    if isinstance(data, torch.Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        fields = [f for f in dataclasses.fields(data) if f.init and not f.metadata.get(LOSS_ONLY)]
        changes = {f.name: cast_floating(getattr(data, f.name), dtype) for f in fields}
        changed = {k: v for k, v in changes.items() if v is not getattr(data, k)}
        return dataclasses.replace(data, **changed) if changed else data
    if isinstance(data, (tuple, list)):
        items = [cast_floating(v, dtype) for v in data]
        if all(new is old for new, old in zip(items, data)):
            return data
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)  # a namedtuple takes fields
    if isinstance(data, dict):
        cast = {k: cast_floating(v, dtype) for k, v in data.items()}
        return data if all(cast[k] is v for k, v in data.items()) else cast
    return data
