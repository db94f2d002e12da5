"""The NaN guard (`train --guard`): a non-finite value never ends the run and never reaches disk.

Triggers, all read from host values the loop already has (no extra host-device sync per step):
  - a non-finite loss, or a non-finite gradient norm on a step the optimizer took (log steps,
    where the loss is fetched anyway; every step on CPU),
  - `max_skips` consecutive steps skipped by the loss scaler (its own inf check, already synced),
  - a loss-scale collapse below `min_scale` (`LossScaleCollapse`).
Response: roll back to the newest checkpoint (every checkpoint is finite, see below), keep the data
stream where it is, so the offending batches are skipped (PaLM's recipe), multiply the learning rate
by `lr_factor`, log a "rollback" event, continue. After `max_rollbacks` rollbacks it gives up with a
`TrainingError` that says what kept happening.

`checkpoint_is_finite` runs before every checkpoint write, guard or not (one sync per checkpoint):
a checkpoint with a non-finite weight or optimizer state is never written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.diagnostics.inject import parse_fault_spec
from ampkit.errors import TrainingError, UsageError
from ampkit.train.checkpoint import list_checkpoints, load_latest


def check_guard_settings(config) -> None:
    """Validate the guard and diagnostics fields of a TrainConfig (UsageError with the fix)."""
    if config.guard_max_skips < 1 or config.guard_max_rollbacks < 1:
        raise UsageError(
            f"--guard-max-skips and --guard-max-rollbacks must be >= 1, got {config.guard_max_skips}, "
            f"{config.guard_max_rollbacks}"
        )
    if not 0 < config.guard_lr_factor <= 1:
        raise UsageError(f"--guard-lr-factor must be in (0, 1], got {config.guard_lr_factor}")
    if config.guard and not config.checkpoint_every:
        raise UsageError(
            "--guard rolls back to the last checkpoint: pass --checkpoint-every N (e.g. 50) so there is a recent one"
        )
    if config.grad_stats_every < 0:
        raise UsageError(f"--grad-stats-every must be >= 0, got {config.grad_stats_every}")
    if config.inject:
        parse_fault_spec(config.inject)


def checkpoint_is_finite(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Whether every weight and every floating optimizer-state tensor is finite (one sync per device).

    Uses the max-abs norm: it is inf or nan exactly when an element is, and cannot overflow the way
    a sum of squares of large finite values can.
    """
    tensors = [p.detach() for p in model.parameters()]
    tensors += [
        v
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    ]
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel():
            by_device.setdefault(t.device, []).append(t)
    for group in by_device.values():
        peaks = torch.stack([n.float() for n in torch._foreach_norm(group, math.inf)])
        if not bool(torch.isfinite(peaks).all()):  # sync point (checkpoint steps only)
            return False
    return True


class NullGuard:
    """`--guard` off: nothing is checked, a scale collapse ends the run as before."""

    enabled = False

    def check(self, result, record: dict[str, Any] | None) -> str | None:
        return None

    def on_collapse(self, err: Exception) -> str:
        raise err

    def ensure_checkpoint(self, write) -> None:
        """Nothing to prepare."""

    def summary(self) -> dict[str, Any]:
        return {"enabled": False}


class NanGuard:
    """`--guard` on. `check` after each step; when it returns a reason, call `rollback`."""

    enabled = True

    def __init__(
        self, *, run_dir: Path, identity: dict[str, Any], max_skips: int, lr_factor: float, max_rollbacks: int
    ):
        self.run_dir, self.identity = Path(run_dir), identity
        self.max_skips, self.lr_factor, self.max_rollbacks = max_skips, lr_factor, max_rollbacks
        self.skips_in_row = 0
        self.events: list[dict[str, Any]] = []

    def check(self, result, record: dict[str, Any] | None) -> str | None:
        """A reason to roll back, or None. `record` is the logged metrics (None off log steps)."""
        self.skips_in_row = 0 if result.stepped else self.skips_in_row + 1
        if record is not None:
            if not math.isfinite(record["loss"]):
                return f"non-finite loss ({record['loss']})"
            if result.stepped and not math.isfinite(record["grad_norm"]):
                return f"non-finite gradient norm ({record['grad_norm']}) applied by the optimizer"
        if self.skips_in_row >= self.max_skips:
            return f"{self.skips_in_row} consecutive steps skipped by the loss scaler"
        return None

    def on_collapse(self, err: Exception) -> str:
        return f"loss scale collapse ({err})"

    def ensure_checkpoint(self, write) -> None:
        """A fresh run has nothing to roll back to: write the initial state first."""
        if not list_checkpoints(self.run_dir):
            write()

    def rollback(self, objs, *, step: int, reason: str, metrics) -> dict[str, Any]:
        """Restore the newest checkpoint (weights, optimizer, schedule, loss scaler; not the data
        position), cut the learning rate, log the event; returns the checkpoint's progress counters."""
        if len(self.events) >= self.max_rollbacks:
            raise TrainingError(
                f"NaN guard gave up after {len(self.events)} rollbacks: at step {step}, {reason} (earlier: "
                f"{'; '.join(e['reason'] + ' at step ' + str(e['step']) for e in self.events)}); run 'ampkit doctor' "
                "to find the layer, lower --lr, or use bf16-mixed where the device supports it"
            )
        ckpt = load_latest(self.run_dir, identity=self.identity)
        lrs_before = list(objs.scheduler.base_lrs)
        objs.model.load_state_dict(ckpt["model"])
        objs.optimizer.load_state_dict(ckpt["optimizer"])
        objs.scheduler.load_state_dict(ckpt["scheduler"])
        objs.policy.load_state_dict(ckpt["precision"])
        objs.optimizer.zero_grad(set_to_none=True)
        # Each rollback cuts the rate in effect before it, so repeated rollbacks to one checkpoint
        # (or after a resume) keep lowering it.
        _set_base_lrs(objs.scheduler, [lr * self.lr_factor for lr in lrs_before])
        self.skips_in_row = 0
        event = {
            "event": "rollback",
            "step": step,
            "to_step": ckpt["step"],
            "reason": reason,
            "lr": objs.optimizer.param_groups[0]["lr"],
            "rollback": len(self.events) + 1,
        }
        self.events.append(event)
        metrics.write(event)
        return ckpt["progress"]

    def summary(self) -> dict[str, Any]:
        return {"enabled": True, "rollbacks": len(self.events), "events": self.events}


def _set_base_lrs(scheduler, base_lrs: list[float]) -> None:
    """Set a LambdaLR's peak rates and the optimizer's current rates to match its position."""
    scheduler.base_lrs = base_lrs
    for group, base, factor in zip(scheduler.optimizer.param_groups, base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def build_guard(config, *, run_dir: Path, identity: dict[str, Any]) -> NanGuard | NullGuard:
    if not config.guard:
        return NullGuard()
    return NanGuard(
        run_dir=run_dir,
        identity=identity,
        max_skips=config.guard_max_skips,
        lr_factor=config.guard_lr_factor,
        max_rollbacks=config.guard_max_rollbacks,
    )
