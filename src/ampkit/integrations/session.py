"""The framework-neutral monitor both callbacks drive (`transformers.py`, `lightning.py`).

Order of calls, whatever the framework: `begin(subject, scaler_fn=...)` once before the first step
(the device/precision check: a precision the device cannot run is refused with `UsageError`, an
emulated one warned about; then the run directory and the hooks), `begin_step(step)` before each
optimizer step, `end_step(step, skipped=...)` after it, `log(step, loss=...)` where the framework
has a loss to give, and `end()` once at the end (summary.json, report.html).

What it attaches is ampkit's own `diagnostics.train_hooks.TrainDiagnostics` (the locator, gradient
statistics, the update-underflow meter, a fault injector), fed the loss scale through `ScaleReading`,
and `diagnostics.scale.ScaleTrajectory`. Every hook only reads tensors (the injector, when asked
for, writes its fault): with the locator off, the losses are bitwise those of a run without it
(tests/integrations/test_transformers.py). A model the hooks cannot reach (not a `torch.nn.Module`,
no trainable parameters, a ScriptModule that refuses hooks) is said once; training goes on with the
check and the loss-scale trajectory only.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ampkit import __version__
from ampkit.core.parallel import LocalRun
from ampkit.diagnostics.scale import ScaleTrajectory
from ampkit.diagnostics.train_hooks import NoDiagnostics, TrainDiagnostics
from ampkit.errors import UsageError
from ampkit.hardware import describe_device
from ampkit.precision import canonical_name, check_supported
from ampkit.provenance import device_text, provenance
from ampkit.runs import METRICS_FILE, SUMMARY_FILE, MetricsWriter, create_run_dir, release_run_dir, say
from ampkit.sections import GuardSection

LOCATOR_MODES = ("off", "auto", "on")
SCHEMA = "ampkit.callback/1"


class AmpkitWarning(UserWarning):
    """What ampkit's callback has to say before or during training (an emulated precision, a model
    it cannot inspect, a framework that ignores a precision flag)."""


@dataclass(frozen=True, kw_only=True)
class MonitorSettings:
    """What the callback watches (both callbacks take these as keyword arguments)."""

    out: str | None = None
    """the run directory (fresh or empty); None: runs/<date>-<time>-callback under the working directory"""
    locator: str = "auto"
    """the non-finite locator: "on" from the first step (a sync per module call: slow), "auto" armed
    after the first skipped step or non-finite loss, "off" never"""
    grad_stats_every: int = 0
    """gradient statistics and the update-underflow meter every N optimizer steps (0 = off; the meter
    copies the trainable parameters at those steps)"""
    log_every: int = 10
    """optimizer steps between the monitor's metrics records (the gradient statistics' only sync)"""
    inject: str = ""
    """a fault to inject, `module_path:phase:kind[@step]` (docs/doctor.md): tests and demos"""

    def __post_init__(self) -> None:
        if self.locator not in LOCATOR_MODES:
            raise UsageError(f"locator={self.locator!r} is not one of {', '.join(LOCATOR_MODES)}")
        if self.grad_stats_every < 0 or self.log_every < 1:
            raise UsageError(
                f"grad_stats_every must be >= 0 and log_every >= 1, got {self.grad_stats_every}, {self.log_every}"
            )


@dataclass(frozen=True, kw_only=True)
class Subject:
    """What is trained, as the framework reports it when training begins."""

    model: Any
    optimizer: Any
    """the torch optimizer that steps (a wrapper's inner one: the underflow meter hooks its step)"""
    precision: str
    """an ampkit precision name (fp32, bf16-mixed, fp16-mixed, ...) for the framework's setting"""
    device: Any
    framework: str
    framework_version: str
    micro_batches: int = 1
    notes: tuple[str, ...] = field(default=())
    """the framework's own precision caveats, warned about like the check's"""


class ScaleReading:
    """The loss scale as the diagnostics read it (`policy.loss_scale()`): the framework's GradScaler
    (None, or a disabled one: no scaling) read once per step, after the optimizer step, by `read`."""

    def __init__(self, scaler_fn: Callable[[], Any]):
        self.scaler_fn = scaler_fn
        self.value: float | None = None

    def read(self) -> float | None:
        scaler = self.scaler_fn()
        if scaler is None or not scaler.is_enabled():
            self.value = None
        else:  # .item(): a sync point, once per step (a non-fused optimizer's scaled step synced already)
            self.value = float(scaler.get_scale())
        return self.value

    def loss_scale(self) -> float | None:
        return self.value


def uninspectable(model: Any) -> str | None:
    """Why ampkit's hooks cannot watch `model`, or None when they can."""
    from torch import nn

    if not isinstance(model, nn.Module):
        return f"it is a {type(model).__name__}, not a torch.nn.Module"
    if not any(p.requires_grad and p.is_floating_point() for p in model.parameters()):
        return "it has no trainable floating-point parameters"
    return None


def _number(value: Any) -> float | None:
    """A loss as a host float (a tensor's `.item()`: a sync point, at log steps only)."""
    if value is None:
        return None
    return float(value.detach().float().item()) if hasattr(value, "detach") else float(value)


class Monitor:
    """One monitored training run: the check, the hooks, the trajectory and the run directory."""

    def __init__(self, settings: MonitorSettings):
        self.settings = settings
        self.subject: Subject | None = None
        self.run_dir: Path | None = None
        self.scale = ScaleReading(lambda: None)
        self.trajectory = ScaleTrajectory()
        self.diagnostics: TrainDiagnostics | NoDiagnostics = NoDiagnostics()
        self.metrics: MetricsWriter | None = None
        self.warnings: list[str] = []
        self.inspected = False
        self.armed_at: int | None = None
        self.steps = 0
        self.losses: list[float] = []
        self._info: Any = None
        self._started = 0.0
        self._said_finding = False
        self.ended = False

    # -- before training ---------------------------------------------------------------------
    def begin(self, subject: Subject, *, scaler_fn: Callable[[], Any] = lambda: None) -> None:
        """Check the device and precision (refuse: UsageError; emulated: a warning), then make the
        run directory and attach the hooks. Call once, before the first step."""
        if self.subject is not None:
            raise UsageError("this ampkit callback already watched a run; give each training run its own callback")
        self._started = time.perf_counter()
        self._info = describe_device(subject.device)
        precision = canonical_name(subject.precision)
        for line in [*check_supported(precision, self._info), *subject.notes]:
            self.warn(line)
        self.scale = ScaleReading(scaler_fn)
        self.trajectory.start(self.scale.read())
        self.diagnostics = self._attach(subject)  # a fault naming no module: UsageError, before any file
        try:
            self.run_dir = create_run_dir(self.settings.out, "callback")
            self.metrics = MetricsWriter(self.run_dir / METRICS_FILE)
        except BaseException:
            self.diagnostics.close()
            raise
        self.subject = subject

    def _attach(self, subject: Subject) -> TrainDiagnostics | NoDiagnostics:
        why = uninspectable(subject.model)
        settings = self.settings
        guard = GuardSection(
            detect_nonfinite=settings.locator == "on",
            grad_stats_every=settings.grad_stats_every,
            inject=settings.inject,
        )
        if why is None:
            try:
                attached = TrainDiagnostics(
                    subject.model,
                    self.scale,
                    guard,
                    micro_batches=subject.micro_batches,
                    optimizer=subject.optimizer,
                    parallel=LocalRun(),
                )
            except (RuntimeError, TypeError, AttributeError) as err:  # e.g. a ScriptModule refuses hooks
                why = f"its hooks were refused ({type(err).__name__}: {err})"
            else:
                self.inspected = True
                return attached
        self.warn(
            f"ampkit cannot inspect the model ({type(subject.model).__name__}): {why}; training goes on with the "
            "precision check and the loss-scale trajectory only (no locator, gradient statistics or fault)"
        )
        return NoDiagnostics()

    def warn(self, line: str) -> None:
        self.warnings.append(line)
        warnings.warn(line, AmpkitWarning, stacklevel=3)

    # -- per step ----------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Before optimizer step `step` (counted from 1)."""
        self.diagnostics.begin_step(step)
        injector = getattr(self.diagnostics, "injector", None)
        if injector is not None:  # a fault's @step is an optimizer step, whatever runs the forward passes
            injector.begin_step(step)

    def end_step(self, step: int, *, skipped: bool | None = None) -> None:
        """After optimizer step `step`; `skipped`: whether the framework says the scaler skipped it. A
        scale that fell counts as a skip as well (torch's GradScaler backs off only when it skips), since
        a framework's flag can miss one: accelerate's misses every skip of an optimizer that unscales in
        its own step (fused AdamW, transformers' default). Arms an "auto" locator after a skipped step."""
        if self.subject is None:
            return
        self.steps = step
        before = self.scale.value
        scale = self.scale.read()
        skipped = bool(skipped) or (before is not None and scale is not None and scale < before)
        self.trajectory.record(step, scale, stepped=not skipped)
        if skipped:
            self._arm(step, why="skipped")
            self._write({"event": "train", "step": step, "loss_scale": scale, "skipped": True})
        if self.is_log_step(step):
            self.diagnostics.at_log_step(step, self.metrics)
            self._say_finding()

    def is_log_step(self, step: int) -> bool:
        return step % self.settings.log_every == 0

    def log(self, step: int, *, loss: Any, grad_norm: Any = None) -> None:
        """The framework's loss at `step` (a tensor or a float) and its gradient norm; a non-finite one
        arms an "auto" locator. (transformers logs a non-finite step's loss as the window's mean of the
        finite ones, `logging_nan_inf_filter`: its gradient norm is what shows the step.)"""
        if self.subject is None:
            return
        value, norm = _number(loss), _number(grad_norm)
        if value is not None:
            self.losses.append(value)
        for what, number in (("loss", value), ("gradient norm", norm)):
            if number is not None and not math.isfinite(number):
                self._arm(step, why=f"non-finite {what}")
        record = {"event": "train", "step": step, "loss": value, "loss_scale": self.scale.value, "grad_norm": norm}
        self._write(record)

    def _arm(self, step: int, *, why: str) -> None:
        if self.settings.locator == "auto" and self.armed_at is None and self.diagnostics.arm_locator():
            self.armed_at = step
            self._write({"event": "locator_armed", "step": step, "after": why})

    def _write(self, record: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(record)

    def _say_finding(self) -> None:
        first = getattr(self.diagnostics, "first", None)
        if first is not None and not self._said_finding:
            self._said_finding = True
            say(f"ampkit: first non-finite value at step {first['step']}: {first['explanation']}")

    # -- after training ----------------------------------------------------------------------
    def end(self, *, status: str = "completed", error: str | None = None) -> dict[str, Any] | None:
        """Write summary.json and the report, detach every hook, release the run directory; the summary."""
        if self.subject is None or self.run_dir is None or self.metrics is None or self.ended:
            return None
        self.ended = True
        from ampkit.integrations.report import write_callback_report
        from ampkit.runs import write_json_atomic

        try:
            self.diagnostics.at_log_step(self.steps, self.metrics)  # what the last log step left
            self._say_finding()
            summary = self.summary(status=status, error=error)
            self.metrics.close()
            write_json_atomic(self.run_dir / SUMMARY_FILE, summary)
            write_callback_report(summary, self.run_dir)
        finally:
            self.diagnostics.close()
            self.metrics.close()
            release_run_dir(self.run_dir)
        say(f"ampkit: wrote {self.run_dir / 'report.html'}")
        return summary

    def summary(self, *, status: str, error: str | None) -> dict[str, Any]:
        assert self.subject is not None
        subject, scale = self.subject, self.trajectory.summary()
        settings = {k: v for k, v in asdict(self.settings).items() if k != "out"}
        return {
            "schema": SCHEMA,
            "command": "callback",
            "ampkit_version": __version__,
            "provenance": provenance(
                device=device_text(self._info),
                config={"precision": subject.precision, "framework": subject.framework, **settings},
            ),
            "status": status,
            "error": error,
            "framework": {"name": subject.framework, "version": subject.framework_version},
            "settings": settings,
            "device": {"type": self._info.type, "name": self._info.name},
            "precision": canonical_name(subject.precision),
            "warnings": self.warnings,
            "model": self._model_block(),
            "steps": self.steps,
            "skipped_steps": scale["skipped"],
            "first_loss": self.losses[0] if self.losses else None,
            "final_loss": self.losses[-1] if self.losses else None,
            "final_loss_scale": scale["final"],
            "locator": self._locator_block(),
            "scale": {**scale, "points": self._scale_points()},
            "inject": self.diagnostics.summary().get("inject"),
            "frozen_layers": self.diagnostics.summary().get("frozen_layers", []),
            "wall_s": time.perf_counter() - self._started,
        }

    def _model_block(self) -> dict[str, Any]:
        assert self.subject is not None
        model = self.subject.model
        params = list(model.parameters()) if hasattr(model, "parameters") else None
        return {
            "cls": type(model).__name__,
            "inspected": self.inspected,
            "parameters": sum(p.numel() for p in params) if params is not None else None,
            "trainable": sum(p.numel() for p in params if p.requires_grad) if params is not None else None,
        }

    def _locator_block(self) -> dict[str, Any]:
        locator = getattr(self.diagnostics, "locator", None)
        found = locator.summary() if locator is not None else {"first_nonfinite": None, "near_limits": []}
        return {
            "armed_at": self.armed_at,
            "first_nonfinite": found["first_nonfinite"],
            "near_limits": found["near_limits"],
        }

    def _scale_points(self) -> list[dict[str, Any]]:
        """The trajectory where it moved (every growth, backoff and skip) and its ends: a step plot's corners."""
        t = self.trajectory
        keep = {e.step for e in t.events} | ({t.steps[0], t.steps[-1]} if t.steps else set())
        return [
            {"step": step, "scale": scale, "skipped": skipped}
            for step, scale, skipped in zip(t.steps, t.scales, t.skipped)
            if step in keep
        ]
