"""A train run's failing window replayed (`doctor --from RUN_DIR[@STEP]`), and the verdict of the replays.

The caller (`ampkit.train.replay`: train's own resume machinery) restores the run's state from a
checkpoint and hands over its Trainer; `replay_window` then runs the steps from the checkpoint up to and
including the recorded failure with doctor's locator, gradient statistics and the loss-scale trajectory
attached, the run's own fault (if it had one) re-armed at the same step numbers. `attribute` compares
the passes (Megatron's re-run of a failing step):
    every pass non-finite at the same step, module and phase -> "numerics" (the model and precision do it)
    every pass finite                                       -> "transient" (the run's failure did not repeat)
    passes that disagree                                    -> "inconclusive" (nondeterminism on this device)
A replay convicts numerics or acquits them; it never convicts a device: a CPU and a GPU (or two GPU
kinds) legitimately round differently, so only another device of the same kind can tell a bad device
from a transient.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ampkit.diagnostics.diagnosed_step import diagnosed_step
from ampkit.diagnostics.gradstats import GradientStatistics, StepGradStats
from ampkit.diagnostics.inject import FaultInjector, FaultSpec
from ampkit.diagnostics.locator import Finding, NonFiniteLocator
from ampkit.diagnostics.scale import ScaleTrajectory

VERDICTS = ("numerics", "transient", "inconclusive")
DEVICE_NOTE = (
    "a replay can convict numerics, never a device: a CPU and a GPU (or two GPU kinds) round differently; "
    "only another device of the same kind can tell a faulty device from a transient"
)


@dataclass
class ReplayPass:
    """One replay of the window: per step (host values) and the first non-finite value not absorbed."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    grad_stats: list[StepGradStats] = field(default_factory=list)
    trajectory: ScaleTrajectory = field(default_factory=ScaleTrajectory)
    locator: dict[str, Any] = field(default_factory=dict)
    nonfinite: Finding | None = None
    """the first non-finite value the loss scaler did not absorb"""
    scaler_overflows: list[Finding] = field(default_factory=list)
    fired: list[int] = field(default_factory=list)
    error: str | None = None
    tokens: int = 0
    """the task's units the steps run trained on (`StepResult.n_tokens`: tokens of a language model)"""
    step_seconds: list[float] = field(default_factory=list)
    """wall-clock seconds of each step run, the diagnosis's hooks and its one host sync a step (so the
    device's work) included"""

    @property
    def units_per_s(self) -> float | None:
        """The task's units trained per second at the median step time (a step slowed by another process
        on a shared machine does not move it); None when no step ran."""
        if not self.step_seconds or not self.tokens:
            return None
        median = sorted(self.step_seconds)[len(self.step_seconds) // 2]
        return self.tokens / (median * len(self.step_seconds)) if median > 0 else None

    @property
    def nonfinite_loss_steps(self) -> list[int]:
        return [s for s, v in zip(self.steps, self.losses) if not math.isfinite(v)]

    @property
    def failed(self) -> bool:
        """Whether the replay went non-finite: a located value, a non-finite loss or a collapsed scale."""
        return self.nonfinite is not None or bool(self.nonfinite_loss_steps) or self.error is not None

    def site(self) -> tuple[int, str, str] | None:
        """(step, module, phase) of the failure, the comparison key between passes."""
        if self.nonfinite is not None:
            return self.nonfinite.step, self.nonfinite.module, self.nonfinite.phase
        if self.failed:
            bad = self.nonfinite_loss_steps
            return (bad[0] if bad else self.steps[-1] if self.steps else 0), "?", "?"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "losses": self.losses,
            "grad_norms": self.grad_norms,
            "nonfinite_loss_steps": self.nonfinite_loss_steps,
            "first_nonfinite": self.nonfinite.to_dict(frames=False) if self.nonfinite else None,
            "fired_steps": self.fired,
            "error": self.error,
        }


def replay_window(
    trainer,
    model: nn.Module,
    policy,
    *,
    first_step: int,
    last_step: int,
    fault: FaultSpec | None = None,
    passed_through: int = 0,
    ring_size: int = 32,
    stop: Callable[[], None] = lambda: None,
) -> ReplayPass:
    """Steps `first_step`..`last_step` of a run whose state `trainer` holds (restored from the checkpoint
    before `first_step`), with the locator, gradient statistics and `fault` attached; ends at the first
    step that goes non-finite. `passed_through`: the recorded run's last step (a `once` fault stays off
    on every step up to it: the run made their first pass). `stop()` runs before each step."""
    record = ReplayPass()
    locator = NonFiniteLocator(model, ring_size=ring_size)
    stats = GradientStatistics(model, every=1, scale_fn=policy.loss_scale)
    injector = FaultInjector(model, fault, passed_through=passed_through) if fault else None
    hooks = [h for h in (injector, locator, stats) if h is not None]
    record.trajectory.start(policy.loss_scale())
    for hook in hooks:
        hook.attach()
    try:
        with policy.run_context():
            for step in range(first_step, last_step + 1):
                stop()
                if not _replay_step(trainer, policy, (injector, locator, stats), record, step):
                    break
    finally:
        for hook in hooks:
            hook.detach()
        record.locator = locator.summary() | {
            "scaler_overflows": [f.to_dict(frames=False) for f in record.scaler_overflows]
        }
        record.nonfinite = locator.first_nonfinite
        record.fired = list(injector.fired) if injector else []
    return record


def _replay_step(trainer, policy, meters, record: ReplayPass, step: int) -> bool:
    """One step into `record`; False once the replay went non-finite (the recorded run stopped there)."""
    injector, locator, stats = meters
    if injector is not None:
        injector.begin_step(step)  # the run's step numbers: a deterministic fault fires at the same step
    locator.begin_step(step)
    stats.begin_step(step)
    started = time.perf_counter()
    stepped = diagnosed_step(trainer, policy, locator, stats, record, step)  # syncs on the loss: device work in
    if stepped is None:  # the loss scale collapsed
        return False
    record.step_seconds.append(time.perf_counter() - started)
    record.steps.append(step)
    record.tokens += stepped[0].n_tokens
    return math.isfinite(stepped[1]) and locator.first_nonfinite is None  # an absorbed overflow: resumed


@dataclass(frozen=True, kw_only=True)
class Attribution:
    """The verdict of `k` replays of one window."""

    verdict: str
    """one of VERDICTS"""
    reason: str
    site: dict[str, Any] | None = None
    """step, module and phase where every pass went non-finite ("numerics" only)"""

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "site": self.site, "note": DEVICE_NOTE}


def attribute(passes: list[ReplayPass], *, recorded_step: int | None) -> Attribution:
    """numerics / transient / inconclusive from the passes (see the module docstring)."""
    sites = [p.site() for p in passes]
    k = len(passes)
    if all(s is None for s in sites):
        where = f" at step {recorded_step}" if recorded_step is not None else ""
        return Attribution(
            verdict="transient",
            reason=f"the run went non-finite{where}, but {k} of {k} replays from its checkpoint stayed finite",
        )
    if sites[0] is not None and len(set(sites)) == 1:
        step, module, phase = sites[0]
        return Attribution(
            verdict="numerics",
            reason=f"{k} of {k} replays went non-finite at step {step} in {module} ({phase}): it repeats",
            site={"step": step, "module": module, "phase": phase},
        )
    seen = "; ".join("finite" if s is None else f"step {s[0]} {s[1]} ({s[2]})" for s in sites)
    return Attribution(verdict="inconclusive", reason=f"the {k} replays disagree ({seen}): nondeterminism here")


def replay_rows(replay: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(label, value) rows of the console and the report for a replay's summary block."""
    if not replay:
        return []
    source = replay["source"]
    window = replay["window"]
    rows = [
        ("replayed run", f"{source['run_dir']} ({source['checkpoint']})"),
        ("window", f"steps {window['first']}-{window['last']} ({replay['passes_run']} replays)"),
    ]
    if source.get("recorded"):
        rows.append(("the run's record", source["recorded"]))
    attribution = replay["attribution"]
    rows.append(("verdict", f"{attribution['verdict']}: {attribution['reason']}"))
    run_on, here = source.get("recorded_device"), source.get("replay_device")
    if run_on and here and run_on != here:  # another device kind rounds differently
        rows.append(("devices", f"the run ran on {run_on}, the replay on {here}: replay on the run's kind to compare"))
    rows.append(("note", attribution["note"]))
    return rows


def replay_section(report, replay: dict[str, Any] | None) -> None:
    """The report's table of the replay passes (an `ampkit.report.Report`)."""
    if not replay:
        return
    report.heading("Replays from the checkpoint")
    attribution = replay["attribution"]
    report.text(f"Verdict: {attribution['verdict']}. {attribution['reason']}.", kind="warn")
    note = attribution["note"]
    report.text(note[0].upper() + note[1:] + ".", kind="note")
    rows = []
    for number, one in enumerate(replay["passes"], 1):
        first = one["first_nonfinite"]
        where = f"{first['module']} ({first['phase']} {first['site']}), step {first['step']}" if first else "finite"
        rows.append(
            [number, f"{one['steps'][0]}-{one['steps'][-1]}" if one["steps"] else "-", where, one["fired_steps"]]
        )
    report.table(["replay", "steps run", "first non-finite", "fault fired at"], rows)


@dataclass(frozen=True, kw_only=True)
class ReplaySource:
    """Where a replay came from: the run, its checkpoint and window, what the run itself recorded."""

    text: str
    """`--from` as given"""
    run_dir: str
    checkpoint: int
    first: int
    last: int
    failure: int | None
    recorded_finding: dict[str, Any] | None = None
    recorded_device: str | None = None
    replay_device: str | None = None
    """the device this replay ran on (a different one from the run's rounds differently)"""
    fired: list[int] = field(default_factory=list)

    def recorded(self) -> str | None:
        """The run's own record of its failure, in words (for the report)."""
        if self.failure is None:
            return None
        text = f"non-finite at step {self.failure}"
        found = self.recorded_finding
        if found:
            text += f"; its locator: {found['module']} ({found['phase']}), step {found['step']}"
        if self.recorded_device:
            text += f"; on {self.recorded_device}"
        return text


def replay_blocks(
    source: ReplaySource, passes: list[ReplayPass], attribution: Attribution, *, fault: str | None
) -> dict[str, Any]:
    """The doctor summary's run, locator, scale, gradients, inject and replay blocks of a replay (the first
    pass's measurements; every pass's outcome in `replay.passes`)."""
    first = passes[0]
    trajectory = first.trajectory
    return {
        "inject": {"spec": fault, "fired_steps": first.fired, "recorded_fired_steps": source.fired} if fault else None,
        "run": {
            "steps": len(first.steps),
            "first_step": source.first,
            "losses": first.losses,
            "grad_norms": first.grad_norms,
            "nonfinite_loss_steps": first.nonfinite_loss_steps,
            "error": first.error,
        },
        "locator": first.locator,
        "scale": trajectory.summary()
        | {
            "points": [
                {"step": s, "scale": v, "skipped": k}
                for s, v, k in zip(trajectory.steps, trajectory.scales, trajectory.skipped)
            ]
        },
        "gradients": {"scale_range": None, "long_tail": None, "steps": [s.to_dict() for s in first.grad_stats]},
        "updates": {"frozen_layers": [], "steps": []},
        "replay": {
            "source": {
                "from": source.text,
                "run_dir": source.run_dir,
                "checkpoint": f"checkpoint at step {source.checkpoint}",
                "checkpoint_step": source.checkpoint,
                "recorded": source.recorded(),
                "recorded_failure_step": source.failure,
                "recorded_finding": source.recorded_finding,
                "recorded_device": source.recorded_device,
                "replay_device": source.replay_device,
            },
            "window": {"first": source.first, "last": source.last},
            "passes_run": len(passes),
            "passes": [p.to_dict() for p in passes],
            "attribution": attribution.to_dict(),
        },
    }
