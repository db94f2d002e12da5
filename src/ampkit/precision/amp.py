"""Mixed precision: fp32 weights, autocast for forward + loss, and (fp16) a dynamic loss scaler."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from ampkit.errors import TrainingError, UsageError
from ampkit.precision.base import Precision, default_dtype
from ampkit.precision.casting import cast_floating
from ampkit.precision.overrides import ModuleOverrides
from ampkit.precision.scaler import HysteresisGradScaler
from ampkit.precision.table import PrecisionSpec


@dataclass(frozen=True, kw_only=True)
class ScalerConfig:
    """GradScaler knobs (torch.amp.GradScaler's own), plus a floor ampkit enforces."""

    init_scale: float = field(
        default=65536.0, metadata={"help": "initial loss scale (2^16); 4096 tames early overflow"}
    )
    growth_factor: float = field(default=2.0, metadata={"help": "scale multiplier after growth_interval clean steps"})
    backoff_factor: float = field(default=0.5, metadata={"help": "scale multiplier when a step overflows"})
    growth_interval: int = field(default=2000, metadata={"help": "clean steps between scale growths"})
    min_scale: float = field(default=1.0, metadata={"help": "floor: a scale below it stops the run (0 disables)"})
    min_scale_policy: str = field(
        default="stop", metadata={"help": "at the floor: stop (the run ends, diverged) or clamp (hold min_scale)"}
    )
    hysteresis: int = field(
        default=1,
        metadata={"help": "back off only after K overflowing steps in a row (DeepSpeed's hysteresis; 1 = torch's)"},
    )

    def grad_scaler_knobs(self) -> dict[str, float]:
        """The knobs torch.amp.GradScaler itself takes, as its keyword arguments."""
        return {
            name: getattr(self, name) for name in ("init_scale", "growth_factor", "backoff_factor", "growth_interval")
        }

    def __post_init__(self) -> None:
        if self.init_scale <= 0:
            raise UsageError(f"--init-scale must be positive, got {self.init_scale}")
        if self.growth_factor <= 1.0:
            raise UsageError(f"--growth-factor must be > 1, got {self.growth_factor}")
        if not 0.0 < self.backoff_factor < 1.0:
            raise UsageError(f"--backoff-factor must be in (0, 1), got {self.backoff_factor}")
        if self.growth_interval < 1:
            raise UsageError(f"--growth-interval must be >= 1, got {self.growth_interval}")
        if self.min_scale < 0:
            raise UsageError(f"--min-scale must be >= 0, got {self.min_scale}")
        if self.min_scale_policy not in MIN_SCALE_POLICIES:
            raise UsageError(f"unknown --min-scale-policy {self.min_scale_policy!r}; choose stop or clamp")
        if self.hysteresis < 1:
            raise UsageError(f"--hysteresis must be >= 1, got {self.hysteresis}")


MIN_SCALE_POLICIES = ("stop", "clamp")


class LossScaleCollapse(TrainingError):
    """The dynamic loss scale fell below its floor: gradients are non-finite step after step."""


class AutocastPrecision(Precision):
    """fp16-mixed and bf16-mixed. The scaler exists for both; for bf16 it is disabled and every
    call on it passes through (torch's own "off" object), so no hook branches on dtype."""

    def __init__(
        self,
        spec: PrecisionSpec,
        *,
        device_type: str,
        scaler: ScalerConfig | None = None,
        overrides: ModuleOverrides | None = None,
    ):
        super().__init__(spec, device_type=device_type, overrides=overrides)
        scaled = [o for o in self.overrides.items if spec.loss_scaling and o.dtype == spec.compute_dtype]
        if scaled:  # torch's GradScaler refuses to unscale gradients stored in the dtype it guards
            raise UsageError(
                f"{spec.name} with {scaled[0]}: the loss scaler cannot unscale gradients stored in "
                f"{scaled[0].regime}'s dtype; keep that subtree in fp32 or bf16-true"
            )
        self.scaler_config = scaler or ScalerConfig()
        cfg = self.scaler_config
        self.scaler = HysteresisGradScaler(
            device_type, hysteresis=cfg.hysteresis, enabled=spec.loss_scaling, **cfg.grad_scaler_knobs()
        )
        # Host copy of the scale, refreshed after each update; avoids an extra device sync
        # to learn the scale *before* a step.
        self._scale = cfg.init_scale if spec.loss_scaling else None

    def forward_context(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.spec.compute_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)  # divides grads by the scale, records inf/nan per device

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        self.scaler.step(optimizer)  # skips optimizer.step() when unscale found inf/nan (a sync point)
        self.scaler.update()  # backs off after `hysteresis` overflows in a row
        if self._scale is None:
            return True
        self._scale = self.scaler.get_scale()  # .item(): sync point
        stepped = not self.scaler.last_skipped  # the scaler skipped exactly the steps that found inf/nan
        if self._scale < self.scaler_config.min_scale:
            if self.scaler_config.min_scale_policy == "clamp":  # hold the floor and keep training
                self.scaler.update(new_scale=float(self.scaler_config.min_scale))
                self._scale = float(self.scaler_config.min_scale)
                return stepped
            raise LossScaleCollapse(
                f"loss scale fell to {self._scale:g}, below min_scale {self.scaler_config.min_scale:g}: "
                "gradients overflow on every step; run 'ampkit doctor' to find the layer, "
                "or use bf16-mixed where the device supports it"
            )
        return stepped

    def loss_scale(self) -> float | None:
        return self._scale

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        scaler_state = state.get("scaler") or {}
        if scaler_state and self.spec.loss_scaling:  # bf16-mixed resumed from an fp16 checkpoint: no scale to take
            self.scaler.load_state_dict(scaler_state)
            self._scale = float(scaler_state["scale"])


class TruePrecision(Precision):
    """bf16-true and fp16-true: weights, gradients and optimizer states in the low-precision dtype.
    The inputs are cast to it too (`convert_input`); the loss is still computed in fp32 (the loss
    function upcasts the logits, against targets left in their own dtype)."""

    def init_context(self) -> contextlib.AbstractContextManager:
        """Construct in the low-precision dtype (torch's default dtype for the block): no fp32 copy."""
        return default_dtype(self.spec.param_dtype)

    def _convert(self, module: torch.nn.Module) -> torch.nn.Module:
        """A no-op for a model built inside `init_context`; casts one built in fp32 (e.g. doctor's).
        Nothing to cast returns the module untouched: `Module.to` would still swap every parameter,
        which a planner's fake tensor refuses."""
        dtype = self.spec.param_dtype
        tensors = [*module.parameters(), *module.buffers()]
        if all(t.dtype == dtype for t in tensors if t.is_floating_point()):
            return module
        return module.to(dtype=dtype)

    def convert_input(self, batch: Any) -> Any:
        """The batch's floating-point tensors in the weights' dtype (a bf16 Linear or GRU refuses fp32
        input; nothing converts it on the way in, unlike autocast). Token ids, class labels and masks
        stay as they are, and so do fields only the loss reads (`LOSS_ONLY`: `TensorBatch.targets`)."""
        return cast_floating(batch, self.spec.param_dtype)
