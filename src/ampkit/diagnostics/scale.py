"""Loss-scale trajectory: every step's scale, growth and backoff events, skipped steps, collapse.

Fed from the policy's host-side scale after each step (no sync beyond the scaler's own), or
rebuilt from a `train` run's metrics.jsonl (`from_metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampkit.records import Record

EARLY_STEPS = 50
"""Skips within the first steps are "early overflow": the initial scale is too high."""


@dataclass(frozen=True, kw_only=True)
class ScaleEvent(Record):
    step: int
    kind: str
    """"growth", "backoff", "held" (an overflow the scaler's hysteresis absorbed: skipped, scale kept) or
    "collapse" (the scale fell below min_scale)"""
    before: float
    after: float


@dataclass
class ScaleTrajectory:
    """Record with `start(scale)` then `record(step, scale, stepped)` after each step."""

    initial: float | None = None
    steps: list[int] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    events: list[ScaleEvent] = field(default_factory=list)
    collapsed_at: int | None = None

    def start(self, scale: float | None) -> None:
        self.initial = scale

    @property
    def active(self) -> bool:
        """Whether this run scales its loss at all (fp16-mixed)."""
        return self.initial is not None

    def record(self, step: int, scale: float | None, *, stepped: bool) -> None:
        if scale is None:
            return
        before = self.scales[-1] if self.scales else (self.initial if self.initial is not None else scale)
        self.steps.append(step)
        self.scales.append(scale)
        self.skipped.append(not stepped)
        if scale > before:
            self.events.append(ScaleEvent(step=step, kind="growth", before=before, after=scale))
        elif scale < before:
            self.events.append(ScaleEvent(step=step, kind="backoff", before=before, after=scale))
        elif not stepped:
            self.events.append(ScaleEvent(step=step, kind="held", before=before, after=scale))

    def record_collapse(self, step: int, scale: float | None) -> None:
        """The scale fell below min_scale at `step` (the policy raised LossScaleCollapse)."""
        before = self.scales[-1] if self.scales else self.initial
        self.collapsed_at = step
        if scale is not None:
            self.steps.append(step)
            self.scales.append(scale)
            self.skipped.append(True)
        self.events.append(ScaleEvent(step=step, kind="collapse", before=before or 0.0, after=scale or 0.0))

    def summary(self) -> dict[str, Any]:
        n_skipped = sum(self.skipped)
        early = [s for step, s in zip(self.steps, self.skipped) if step <= EARLY_STEPS]
        return {
            "active": self.active,
            "initial": self.initial,
            "final": self.scales[-1] if self.scales else self.initial,
            "min": min(self.scales) if self.scales else self.initial,
            "max": max(self.scales) if self.scales else self.initial,
            "steps": len(self.steps),
            "skipped": n_skipped,
            "skipped_fraction": n_skipped / len(self.steps) if self.steps else 0.0,
            "early_skipped": sum(early),
            "growths": sum(e.kind == "growth" for e in self.events),
            "backoffs": sum(e.kind == "backoff" for e in self.events),
            "held": sum(e.kind == "held" for e in self.events),
            "collapsed_at": self.collapsed_at,
            "events": [e.to_dict() for e in self.events[:50]],
        }


def from_metrics(records: list[dict[str, Any]], *, initial: float | None = None) -> ScaleTrajectory:
    """Rebuild the trajectory from `train` metrics records (`event == "train"`, with loss_scale/skipped)."""
    trajectory = ScaleTrajectory()
    trajectory.start(initial)
    for rec in records:
        if rec.get("event") != "train" or rec.get("loss_scale") is None:
            continue
        if trajectory.initial is None:
            trajectory.start(rec["loss_scale"])
        trajectory.record(rec["step"], rec["loss_scale"], stepped=not rec.get("skipped", False))
    return trajectory
