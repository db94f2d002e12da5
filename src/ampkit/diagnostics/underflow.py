"""The update-underflow meter: per layer, how much of an optimizer step's update was lost to rounding,
how much of the gradient flushes to zero in fp16, and which layers have stopped changing at all.

The source article's LoRA run under fp16: low-rank matrices whose gradients were so small that
"after a few thousand steps some parameters froze completely". Two mechanisms, both measured here:
- **lost updates**: a weight stored in dtype D changes only when its update is at least half a unit
  in the last place of D at that weight, |delta w| >= ulp(w)/2 (round to nearest). An fp16 weight of
  0.1 has ulp 2^-14 = 6.1e-5: an update below 3.1e-5 rounds away and the weight does not move. Per
  tensor the meter counts the elements whose gradient was nonzero (so the optimizer's update was not)
  whose stored value is bit-for-bit the same after the step: those updates were lost to rounding.
- **flushed gradients**: gradient elements that become 0 when g * scale is cast to fp16 (|g * scale|
  <= 2^-25) at the step's loss scale, and those that are already exactly 0 (an fp16 gradient that
  underflowed in the backward).
A layer (the module owning the weights: LoRA's `q_proj.lora_A.default` is one) whose weights did not change in
`frozen_after` consecutive measured optimizer steps is *frozen*, and is reported with its module path
and the fix: bf16-mixed (fp32's range, nothing flushes), a larger loss scale (--init-scale), fp32
adapters / fp32 master weights (an fp32 weight of 0.1 moves for updates down to 3.7e-9), or stochastic
rounding of the update (unbiased: small updates land on average).

Hooks: the optimizer's step pre-hook snapshots the trainable weights (a copy of the trainable
parameters on armed steps: `every`), the post-hook compares; a step the loss scaler skipped is not
counted: torch's GradScaler does not call a plain optimizer's `step` then, and an optimizer that takes
the scaling into its own step (fused AdamW, `_step_supports_amp_scaling`) is called with
`optimizer.found_inf` set, kept beside the step's counts and read at `drain()` (its sync point). Counts
stay on the device until `drain()` (log steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ampkit.diagnostics.fp16 import FP16_FLUSH_AT
from ampkit.diagnostics.meter import ParameterMeter

FROZEN_AFTER = 10
"""Consecutive measured optimizer steps without a change that make a layer frozen (the default)."""
_ROW = 5  # per-tensor device row: [n changed, n lost (grad != 0, unchanged), n would flush, n grad == 0, numel]


def layer_of_parameter(name: str) -> str:
    """The module a parameter belongs to: "fc1.weight" -> "fc1"; a LoRA adapter is its own module,
    "blocks.0.attn.q_proj.lora_A.default.weight" -> "blocks.0.attn.q_proj.lora_A.default"."""
    return name.rsplit(".", 1)[0] if "." in name else name


@dataclass(frozen=True, kw_only=True)
class LayerUpdateStats:
    """One layer's update at one optimizer step."""

    name: str
    numel: int
    dtype: str
    """the stored dtype of its trainable weights"""
    lost_fraction: float
    """elements with a nonzero gradient whose stored value did not change: the update rounded away"""
    unchanged_fraction: float
    """elements whose stored value did not change, for any reason"""
    flush_fraction: float
    """nonzero gradient elements that flush to zero when g * scale is cast to fp16"""
    zero_grad_fraction: float
    """gradient elements that are exactly zero (an fp16 gradient that underflowed in the backward)"""
    unchanged_steps: int
    """consecutive measured optimizer steps, up to this one, in which no element of the layer changed"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class StepUpdateStats:
    step: int
    scale: float
    layers: list[LayerUpdateStats]

    @property
    def lost_fraction(self) -> float:
        """Share of all trainable elements of the step whose update was lost (nonzero gradient, unchanged)."""
        total = sum(layer.numel for layer in self.layers)
        return sum(layer.lost_fraction * layer.numel for layer in self.layers) / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "scale": self.scale,
            "lost_fraction": self.lost_fraction,
            "layers": [layer.to_dict() for layer in self.layers],
        }


@dataclass(frozen=True, kw_only=True)
class FrozenLayer:
    """A layer whose weights stopped changing."""

    name: str
    dtype: str
    since_step: int
    """the first of the unchanged steps"""
    steps: int
    """consecutive measured optimizer steps without a change (so far)"""
    zero_grad_fraction: float
    flush_fraction: float
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def frozen_fix(*, dtype: str, zero_grad_fraction: float, flush_fraction: float) -> str:
    """The fixes for a frozen layer, the one its evidence points at first."""
    low_storage = dtype in ("float16", "bfloat16")
    storage = (
        f"store its weights in fp32: fp32 adapters (ampkit's LoRA default; peft's autocast_adapter_dtype) or fp32 "
        f"master weights under a *-mixed precision ({dtype} weights ignore updates below half an ulp)"
    )
    rounding = "stochastic rounding of the update, so that updates below half an ulp land on average"
    flush = (
        "bf16-mixed (fp32's exponent range: gradients do not flush to zero), or a larger loss scale "
        "(--init-scale 65536 or more) under fp16-mixed"
    )
    order = [flush, storage, rounding] if zero_grad_fraction + flush_fraction > 0.5 else [storage, flush, rounding]
    if not low_storage:
        order = [flush, rounding]
    return "; or ".join(order)


class UpdateUnderflowMeter(ParameterMeter):
    """Measures every `every`-th optimizer step of `optimizer` over `model`'s trainable parameters.

    `begin_step(step)` before each training step (arms it), `drain()` at log steps (a sync point),
    `frozen` for the layers frozen now. `scale_fn` gives the loss scale of the coming backward (the
    fp16 flush forecast; None = no scaling)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        every: int = 1,
        frozen_after: int = FROZEN_AFTER,
        scale_fn: Callable[[], float | None] = lambda: None,
    ):
        if every < 1 or frozen_after < 1:
            raise ValueError(f"every and frozen_after must be >= 1, got {every}, {frozen_after}")
        super().__init__(model, every=every, scale_fn=scale_fn)
        self.layers = [layer_of_parameter(n) for n in self.names]
        self.optimizer, self.frozen_after = optimizer, frozen_after
        self.pending: list[tuple[int, float, torch.Tensor, torch.Tensor | None]] = []
        """(step, scale, counts, found_inf: the scaler's flag a fused optimizer skipped the step by, or None)"""
        self._before: list[torch.Tensor] | None = None
        self._unchanged: dict[str, int] = {}
        self._since: dict[str, int] = {}
        self._last: dict[str, LayerUpdateStats] = {}

    def attach(self) -> UpdateUnderflowMeter:
        if not self._handles:
            self._handles = [
                self.optimizer.register_step_pre_hook(self._pre_step),
                self.optimizer.register_step_post_hook(self._post_step),
            ]
        return self

    @torch.no_grad()
    def _pre_step(self, optimizer, args, kwargs) -> None:
        self._before = [p.detach().clone() for p in self.params] if self._armed else None

    @torch.no_grad()
    def _post_step(self, optimizer, args, kwargs) -> None:
        if self._before is None:
            return
        rows = [self._row(p, old) for p, old in zip(self.params, self._before)]
        found_inf = getattr(optimizer, "found_inf", None)  # set by GradScaler.step for a fused optimizer
        flag = found_inf.detach().clone() if isinstance(found_inf, torch.Tensor) else None  # no sync here
        self.pending.append((self._step, self._scale, torch.stack(rows), flag))
        self._before = None

    def _row(self, param: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """[n changed, n lost, n would flush in fp16, n zero gradient, numel] of one tensor, on its device."""
        changed = (param.detach() != old).sum().float()  # bitwise: any change of the stored value
        numel = torch.tensor(float(param.numel()), device=param.device)
        if param.grad is None:  # no gradient at all: nothing was meant to move
            return torch.stack([changed, torch.zeros_like(changed), torch.zeros_like(changed), numel, numel])
        g = param.grad.detach()
        nonzero = g != 0
        unchanged = param.detach() == old
        would_flush = nonzero & (g.float().abs() * self._scale <= FP16_FLUSH_AT)
        lost = (nonzero & unchanged).sum().float()
        return torch.stack([changed, lost, would_flush.sum().float(), (~nonzero).sum().float(), numel])

    def drain(self) -> list[StepUpdateStats]:
        """The measured steps since the last drain, per layer (a sync point: log steps only)."""
        out = [
            self._host_stats(step, scale, rows.tolist())  # sync point
            for step, scale, rows, found_inf in self.pending
            if found_inf is None or not bool(found_inf.sum() > 0)  # a fused optimizer's skipped step
        ]
        self.pending = []
        return out

    def _host_stats(self, step: int, scale: float, rows: list[list[float]]) -> StepUpdateStats:
        merged: dict[str, list[float]] = {}
        dtypes: dict[str, str] = {}
        for layer, param, row in zip(self.layers, self.params, rows):
            acc = merged.setdefault(layer, [0.0] * _ROW)
            merged[layer] = [a + b for a, b in zip(acc, row)]
            dtypes.setdefault(layer, str(param.dtype).removeprefix("torch."))
        layers = [self._layer(step, name, row, dtypes[name]) for name, row in merged.items()]
        return StepUpdateStats(step=step, scale=scale, layers=layers)

    def _layer(self, step: int, name: str, row: list[float], dtype: str) -> LayerUpdateStats:
        changed, lost, flush, zero, numel = row
        if changed == 0:
            self._since.setdefault(name, step)
            self._unchanged[name] = self._unchanged.get(name, 0) + 1
        else:
            self._since.pop(name, None)
            self._unchanged[name] = 0
        nonzero = numel - zero
        stats = LayerUpdateStats(
            name=name,
            numel=int(numel),
            dtype=dtype,
            lost_fraction=lost / nonzero if nonzero else 0.0,
            unchanged_fraction=1.0 - changed / numel if numel else 1.0,
            flush_fraction=flush / numel if numel else 0.0,
            zero_grad_fraction=zero / numel if numel else 0.0,
            unchanged_steps=self._unchanged[name],
        )
        self._last[name] = stats
        return stats

    @property
    def frozen(self) -> list[FrozenLayer]:
        """Layers unchanged for at least `frozen_after` consecutive measured optimizer steps, now."""
        out = []
        for name, stats in self._last.items():
            if self._unchanged.get(name, 0) >= self.frozen_after:
                out.append(
                    FrozenLayer(
                        name=name,
                        dtype=stats.dtype,
                        since_step=self._since[name],
                        steps=self._unchanged[name],
                        zero_grad_fraction=stats.zero_grad_fraction,
                        flush_fraction=stats.flush_fraction,
                        fix=frozen_fix(
                            dtype=stats.dtype,
                            zero_grad_fraction=stats.zero_grad_fraction,
                            flush_fraction=stats.flush_fraction,
                        ),
                    )
                )
        return out


def ulp(value: float, dtype: torch.dtype) -> float:
    """The unit in the last place of `value` stored in `dtype` (the spacing to the next larger magnitude)."""
    t = torch.tensor(abs(value), dtype=dtype)
    return (torch.nextafter(t, torch.tensor(math.inf, dtype=dtype)) - t).item()
