"""The range audit's backward side: per module, the largest |gradient| x the loss scale against the format.

Under fp16-mixed the backward holds gradients multiplied by the loss scale, in fp16: the gradient
arriving at each autocast op's output (an activation gradient) and the weight gradient its fp16 matmul
produces before the cast to the fp32 `.grad`. The scaler starts at its init scale (65536 by default),
so a true-scale |g| above 65504 / 65536 = 0.9995 is inf on step 1: the step is skipped and the scale
halved, once per doubling too many (more with hysteresis). The audit forecasts that before step 1 from
the same fp32 batches as the forward side: one backward each (`Precision.backward` of the fp32 policy),
recording per module
- `output_grad_max`: the largest finite |gradient| at its floating outputs (a tensor hook on each,
  `grad_hooks.hook_outputs`: no module backward hooks, which break models that modify outputs in place);
- `weight_grad_max`: the largest finite |.grad| of its own parameters, per batch (zeroed between them);
- `grad_scaled_max`: the larger of the two times the loss scale.
A module is flagged when `grad_scaled_max` exceeds the format's max; the init scale that fits is the
largest power of two S with (largest |g|) x S <= max. Hazard: the audit runs in fp32 and cannot tell
which of these gradients fp16 really holds (autocast keeps softmax, norms and the loss in fp32), so it
forecasts as if all were: an upper bound the diagnostic run's skipped steps confirm or not. The
gradients are of the initial model: later in training they shrink or grow, which the dynamic scaler
follows. Cost: one backward per audited batch; per-module maxima stay on the device until the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ampkit.diagnostics.grad_hooks import hook_outputs
from ampkit.diagnostics.range_target import RangeTarget
from ampkit.records import Record

TOP = 4
"""Flagged modules named in the advice's evidence (all of them are in summary.json)."""


@dataclass(frozen=True, kw_only=True)
class GradOverflow(Record):
    """A module whose scaled gradients overflow the format at the initial loss scale."""

    module: str
    site: str
    """"output grads" or "weight grads": the larger of the two"""
    grad_max: float
    """largest true-scale |gradient| there (fp32 audit)"""
    scaled_max: float
    """`grad_max` x the loss scale: what the backward holds"""
    headroom_bits: float
    """log2(max / scaled_max) (< 0: inf in the format)"""


def _amax(t: torch.Tensor) -> torch.Tensor:
    """Largest finite |t| (0 for an empty or all-inf tensor: an fp32 inf is the locator's)."""
    a = t.detach().abs().float()
    a = torch.where(torch.isfinite(a), a, torch.zeros((), device=a.device))
    return a.amax() if a.numel() else a.new_zeros(())


def _fold(old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    return new if old is None else torch.maximum(old, new.to(old.device))


class GradRangeRecorder:
    """Forward hooks that hook every module's outputs for their gradients; `backward(loss)` runs one
    backward through `policy` and folds each module's own parameters' gradients in. The model's `.grad`
    are restored on `detach`."""

    def __init__(self, model: nn.Module, names: dict[int, str]):
        self.model = model
        self.names = names
        self.outputs: dict[str, torch.Tensor] = {}
        self.weights: dict[str, torch.Tensor] = {}
        self._handles: list[Any] = []
        self._saved = {p: p.grad for p in model.parameters()}

    def attach(self) -> GradRangeRecorder:
        for module in self.model.modules():
            self._handles.append(module.register_forward_hook(self._hook(self.names[id(module)])))
        for p in self._saved:
            p.grad = None
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for p, grad in self._saved.items():
            p.grad = grad

    def _hook(self, name: str):
        def on_grad(grad: torch.Tensor) -> None:
            self.outputs[name] = _fold(self.outputs.get(name), _amax(grad))

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            hook_outputs(output, on_grad)

        return hook

    def backward(self, policy, loss: torch.Tensor) -> bool:
        """One backward of `loss` (the fp32 policy's: true scale), then each module's own parameters'
        largest |grad|, their gradients cleared for the next batch; False when nothing needs a gradient."""
        if not loss.requires_grad:
            return False
        policy.backward(loss)
        for module in self.model.modules():
            grads = [_amax(p.grad) for p in module.parameters(recurse=False) if p.grad is not None]
            if grads:
                name = self.names[id(module)]
                self.weights[name] = _fold(self.weights.get(name), torch.stack(grads).amax())
        for p in self._saved:
            p.grad = None
        return True

    def host(self) -> dict[str, tuple[float | None, float | None]]:
        """{module: (output grad max, weight grad max)}, one host sync for all."""
        names = list(dict.fromkeys([*self.outputs, *self.weights]))
        flat = [self.outputs.get(n) for n in names] + [self.weights.get(n) for n in names]
        device = next((t.device for t in flat if t is not None), torch.device("cpu"))
        nan = torch.tensor(math.nan, device=device)
        values = torch.stack([nan if t is None else t.to(device) for t in flat]).tolist() if flat else []  # the sync
        n = len(names)
        return {name: (_opt(values[i]), _opt(values[n + i])) for i, name in enumerate(names)}


def _opt(value: float) -> float | None:
    return None if math.isnan(value) else value


def with_gradients(ranges: list, grads: dict[str, tuple[float | None, float | None]], target: RangeTarget) -> list:
    """`ranges` (`ModuleRange`s) with their gradient fields filled from `GradRangeRecorder.host()`."""
    out = []
    for m in ranges:
        out_g, w_g = grads.get(m.name, (None, None))
        largest = max((g for g in (out_g, w_g) if g is not None), default=None)
        scaled = None if largest is None else largest * target.loss_scale
        out.append(replace(m, output_grad_max=out_g, weight_grad_max=w_g, grad_scaled_max=scaled))
    return out


def grad_overflows(ranges: list, target: RangeTarget) -> list[GradOverflow]:
    """The modules whose scaled gradients exceed the target's max, largest first (none for fp32)."""
    if target.unbounded:
        return []
    found = []
    for m in ranges:
        if m.grad_scaled_max is None or m.grad_scaled_max <= target.max:
            continue
        out_g, w_g = m.output_grad_max or 0.0, m.weight_grad_max or 0.0
        site, g = ("output grads", out_g) if out_g >= w_g else ("weight grads", w_g)
        found.append(
            GradOverflow(
                module=m.name,
                site=site,
                grad_max=g,
                scaled_max=m.grad_scaled_max,
                headroom_bits=math.log2(target.max / m.grad_scaled_max),
            )
        )
    return sorted(found, key=lambda o: o.headroom_bits)


def largest_grad(ranges: list) -> float | None:
    """The largest true-scale |gradient| of any module (None: no backward, or all zero)."""
    seen = [g for m in ranges for g in (m.output_grad_max, m.weight_grad_max) if g]
    return max(seen) if seen else None


def fitting_scale(grad_max: float | None, target: RangeTarget) -> float | None:
    """The largest power-of-two loss scale S with grad_max x S <= the target's max (None: nothing
    measured; below 1 when even true-scale gradients overflow: no loss scale helps)."""
    if not grad_max:
        return None
    return 2.0 ** math.floor(math.log2(target.max / grad_max))


def grad_lines(overflows: list[GradOverflow], target: RangeTarget, batches: int) -> list[str]:
    """One line of evidence per flagged module (the first `TOP`)."""
    return [
        f"{o.module}: {o.site} reach |g| {o.grad_max:.3g} over {batches} fp32 batch{'' if batches == 1 else 'es'}, "
        f"x loss scale {target.loss_scale:g} = {o.scaled_max:.3g} > {target.format}'s max {target.max:g} "
        f"({o.headroom_bits:+.2f} bits)"
        for o in overflows[:TOP]
    ]


def scale_fix(scale: float | None, target: RangeTarget) -> str:
    """The fix for scaled gradients that overflow: the init scale that fits, or bf16 when none does."""
    if scale is None or scale < 1:
        return (
            f"no loss scale fits: gradients exceed {target.format}'s max at true scale; use bf16 "
            "(--precision bf16-mixed) or find the module that makes them (clip, keep it in fp32)"
        )
    return (
        f"start the loss scale at {scale:g} (--init-scale {scale:g}): the largest power of two under which "
        f"every audited gradient fits {target.format}; or bf16 (--precision bf16-mixed), which needs no scaler"
    )
