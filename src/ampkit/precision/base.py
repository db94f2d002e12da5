"""The precision interface. Every hook does the plain-fp32 thing by default; each regime overrides
only what differs, so the training loop never asks "is this fp16?".

Building (`ampkit.train.build`): the model is constructed inside `policy.init_context()`, so its
weights are born in their storage dtype, then `policy.convert_module` adapts it (the low-bit formats'
Linear swap, reported by `policy.conversion()`) and applies the policy's per-module overrides
(`policy.overrides`: `--keep-fp32`, `precision/overrides.py`).

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
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ampkit.precision.casting import LOSS_ONLY, cast_floating  # noqa: F401 (re-exported: their old home)
from ampkit.precision.convert.report import ConversionReport
from ampkit.precision.overrides import ModuleOverrides
from ampkit.precision.table import PrecisionSpec


class Precision:
    """fp32 and tf32: no autocast, no scaling; TF32 flags set from the spec for the run's duration."""

    def __init__(self, spec: PrecisionSpec, *, device_type: str, overrides: ModuleOverrides | None = None):
        self.spec = spec
        self.device_type = device_type
        self.overrides = overrides or ModuleOverrides()
        """modules kept in another regime (`precision/overrides.py`), applied by `convert_module`"""
        self.overridden: dict[str, str] = {}
        """module path -> regime, what the last `convert_module` applied (summaries record it)"""

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
        """The model as this regime runs it: the regime's own conversion (`_convert`), then the per-module
        overrides (fp32 islands, -true subtrees; none: nothing). Outputs of an overridden subtree go back
        to their incoming dtype where no autocast would cast them for the next op."""
        module = self._convert(module)
        self.overridden = {path: o.regime for path, o in self.overrides.resolve(module).items()}
        return self.overrides.apply(module, device_type=self.device_type, restore_outputs=not self.spec.autocast)

    def _convert(self, module: nn.Module) -> nn.Module:
        """The regime's conversion of the whole model; fp32 weights: nothing to change."""
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
