"""What a run does when its numbers go non-finite: stop (the default) or roll back (`train --guard`).

Triggers, all read from host values the loop already has (no extra host-device sync per step):
  - a non-finite loss at a log step (where the loss is fetched anyway; every step on CPU),
  - a loss-scale collapse below `min_scale` (`LossScaleCollapse`),
  - with `--guard` also: a non-finite gradient norm on a step the optimizer took, and `max_skips`
    consecutive steps skipped by the loss scaler (its own inf check, already synced).
Under `--parallel ddp|fsdp` every rank checks its own values, then the ranks agree (`agreed_reason`):
one all-reduce per step (MAX of a 0/1 "something is non-finite here" flag; a sync point), so either
every rank rolls back at that step or none does -- no rank steps, skips or restores alone. The
rollback reads the sharded (DCP) checkpoint on every rank (`ShardedCheckpointer.rollback`).
Responses:
  - `StopOnDivergence` (no `--guard`): the run ends with status "diverged" (`RunDiverged`, exit 1),
    no checkpoint of the non-finite state, and a line naming the step and the next command.
  - `NanGuard` (`--guard`): roll back to the newest checkpoint (every checkpoint is finite: the
    checkpointer refuses to write non-finite state), keep the data stream where it is, so the
    offending batches are skipped (PaLM's recipe), multiply the learning rate by `lr_factor`, log a
    "rollback" event, continue. After `max_rollbacks` rollbacks it gives up with a `TrainingError`
    that says what kept happening.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ampkit.core.parallel import LocalRun
from ampkit.diagnostics.inject import parse_fault_spec
from ampkit.errors import RunDiverged, TrainingError, UsageError
from ampkit.sections import GuardSection

if TYPE_CHECKING:
    import torch

    from ampkit.core.step import StepResult
    from ampkit.train.checkpointer import CheckpointedRun, FileCheckpointer, RunProgress, ShardedCheckpointer
    from ampkit.train.loggers import RecordWriter


def check_guard_settings(guard: GuardSection, *, checkpoint_every: int) -> None:
    """What the `[guard]` section cannot check alone (UsageError with the fix): the rollback needs the
    run's periodic checkpoints (`[checkpoint] checkpoint_every`); an injected fault's syntax."""
    if guard.guard and not checkpoint_every:
        raise UsageError(
            "--guard rolls back to the last checkpoint: pass --checkpoint-every N (e.g. 50) so there is a recent one"
        )
    if guard.inject:
        parse_fault_spec(guard.inject)


def _nonfinite_loss(record: dict[str, Any] | None) -> str | None:
    if record is not None and not math.isfinite(record["loss"]):
        return f"non-finite loss ({record['loss']})"
    return None


class StopOnDivergence:
    """`--guard` off: a non-finite loss or a scale collapse ends the run ("diverged")."""

    enabled = False

    def __init__(
        self, doctor_args: str, *, run_dir: Path | None = None, has_checkpoint: Callable[[], bool] = lambda: False
    ) -> None:
        self.doctor_args, self.run_dir = doctor_args, run_dir
        self.has_checkpoint = has_checkpoint
        """whether the run has written a checkpoint (then `doctor --from` replays the failing window)"""

    def check(self, result: StepResult, record: dict[str, Any] | None) -> str | None:
        """A reason the run cannot go on, or None. `record` is the logged metrics (None off log steps)."""
        return _nonfinite_loss(record)

    def on_collapse(self, err: Exception) -> str:
        return f"the loss scale collapsed ({err})"

    def recover(self, objs: CheckpointedRun, *, step: int, reason: str, metrics: RecordWriter) -> NoReturn:
        """Nothing to roll back to: end the run, naming the step and what to run next (with a checkpoint
        before the step: `doctor --from`, which replays exactly the failing batches)."""
        find = f"ampkit doctor {self.doctor_args}"
        if self.run_dir is not None and self.has_checkpoint():
            find = f"ampkit doctor --from {self.run_dir} (replays its last checkpoint's steps to step {step})"
        raise RunDiverged(
            f"{reason} at step {step}; no checkpoint of this state was written. Find the layer with: "
            f"{find}; or rerun with --guard --checkpoint-every N to roll back past it"
        )

    def ensure_checkpoint(self, write: Callable[[], object]) -> None:
        """Nothing to prepare."""

    def summary(self) -> dict[str, Any]:
        return {"enabled": False}


class NanGuard:
    """`--guard` on. `check` after each step; when it returns a reason, call `recover` (a rollback)."""

    enabled = True

    def __init__(
        self,
        *,
        checkpointer: FileCheckpointer | ShardedCheckpointer,
        run_dir: Path,
        max_skips: int,
        lr_factor: float,
        max_rollbacks: int,
        parallel: LocalRun | None = None,
    ) -> None:
        self.checkpointer, self.run_dir = checkpointer, Path(run_dir)
        self.parallel = parallel if parallel is not None else LocalRun()
        self.max_skips, self.lr_factor, self.max_rollbacks = max_skips, lr_factor, max_rollbacks
        self.skips_in_row = 0
        self.events: list[dict[str, Any]] = []

    def check(self, result: StepResult, record: dict[str, Any] | None) -> str | None:
        """A reason to roll back, agreed by every rank, or None. `record` is the logged metrics (None
        off log steps). Every rank calls it at every step (a collective when distributed)."""
        return agreed_reason(self.parallel, self._local_reason(result, record))

    def _local_reason(self, result: StepResult, record: dict[str, Any] | None) -> str | None:
        self.skips_in_row = 0 if result.stepped else self.skips_in_row + 1
        if reason := _nonfinite_loss(record):
            return reason
        if record is not None and result.stepped and not math.isfinite(record["grad_norm"]):
            return f"non-finite gradient norm ({record['grad_norm']}) applied by the optimizer"
        if self.skips_in_row >= self.max_skips:
            return f"{self.skips_in_row} consecutive steps skipped by the loss scaler"
        return None

    def on_collapse(self, err: Exception) -> str:
        return f"loss scale collapse ({err})"

    def ensure_checkpoint(self, write: Callable[[], object]) -> None:
        """A fresh run has nothing to roll back to: write the initial state first."""
        if not self.checkpointer.has_checkpoint(self.run_dir):
            write()

    def recover(self, objs: CheckpointedRun, *, step: int, reason: str, metrics: RecordWriter) -> RunProgress:
        """Restore the newest checkpoint (weights, optimizer, schedule, loss scaler; not the data
        position), cut the learning rate, log the event; returns the checkpoint's progress counters."""
        if len(self.events) >= self.max_rollbacks:
            earlier = "; ".join(e["reason"] + " at step " + str(e["step"]) for e in self.events)
            raise TrainingError(
                f"NaN guard gave up after {len(self.events)} rollbacks: at step {step}, {reason} (earlier: "
                f"{earlier}); run 'ampkit doctor' to find the layer, lower --lr, or use bf16-mixed where the "
                "device supports it"
            )
        lrs_before = list(objs.scheduler.base_lrs)
        to_step, progress = self.checkpointer.rollback(objs, self.run_dir)
        # Each rollback cuts the rate in effect before it, so repeated rollbacks to one checkpoint
        # (or after a resume) keep lowering it.
        _set_base_lrs(objs.scheduler, [lr * self.lr_factor for lr in lrs_before])
        self.skips_in_row = 0
        event = {
            "event": "rollback",
            "step": step,
            "to_step": to_step,
            "reason": reason,
            "lr": objs.optimizer.param_groups[0]["lr"],
            "rollback": len(self.events) + 1,
        }
        self.events.append(event)
        metrics.write(event)
        return progress

    def summary(self) -> dict[str, Any]:
        return {"enabled": True, "rollbacks": len(self.events), "events": self.events}


def agreed_reason(parallel: LocalRun, local: str | None) -> str | None:
    """One decision for every rank: a reason when any rank has one (the lowest such rank's, naming the
    ranks that saw it when there are several), else None. Sync point: `all_true` all-reduces a 0/1
    flag (MAX) every step; the reasons are gathered only on a step some rank flagged (all know it)."""
    if parallel.all_true(local is None):
        return None
    reasons = parallel.all_gather_object(local)
    flagged = [rank for rank, text in enumerate(reasons) if text is not None]
    reason = reasons[flagged[0]]
    if len(reasons) == 1:
        return reason
    where = "every rank" if len(flagged) == len(reasons) else "rank " + ", ".join(map(str, flagged))
    return f"{reason} on {where}"


def _set_base_lrs(scheduler: torch.optim.lr_scheduler.LambdaLR, base_lrs: list[float | torch.Tensor]) -> None:
    """Set a LambdaLR's peak rates and the optimizer's current rates to match its position (torch
    types a peak rate float or tensor)."""
    scheduler.base_lrs = base_lrs
    for group, base, factor in zip(scheduler.optimizer.param_groups, base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def build_guard(
    guard: GuardSection,
    *,
    doctor_args: str,
    checkpointer: FileCheckpointer | ShardedCheckpointer,
    run_dir: Path,
    parallel: LocalRun | None = None,
) -> NanGuard | StopOnDivergence:
    """`NanGuard` with `--guard`, else `StopOnDivergence` (chosen once; the loop calls either the same way).
    `doctor_args`: the `ampkit doctor` flags that diagnose the run's step (`TrainConfig.doctor_args`);
    `parallel`: the run's world (`LocalRun` in one process), across which `NanGuard` agrees."""
    if not guard.guard:
        written = functools.partial(checkpointer.has_checkpoint, run_dir) if checkpointer is not None else bool
        return StopOnDivergence(doctor_args, run_dir=run_dir, has_checkpoint=written)
    return NanGuard(
        checkpointer=checkpointer,
        run_dir=run_dir,
        max_skips=guard.guard_max_skips,
        lr_factor=guard.guard_lr_factor,
        max_rollbacks=guard.guard_max_rollbacks,
        parallel=parallel,
    )
