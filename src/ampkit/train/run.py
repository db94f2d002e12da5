"""A whole training run: steps, logging, evaluation, checkpoints, summary.

Host-device syncs happen only at log, eval and checkpoint steps (`log_every` is 1 on CPU, where a
sync is free, and 10 on CUDA by default) -- plus the one GradScaler itself makes per step in fp16.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ampkit import __version__
from ampkit.diagnostics.train_hooks import build_train_diagnostics
from ampkit.distributed.checkpoint import all_finite, save_sharded
from ampkit.errors import RunInterrupted, TrainingError, UsageError
from ampkit.memory import peak_memory_bytes, reset_peak_memory
from ampkit.precision import LossScaleCollapse
from ampkit.runs import (
    METRICS_FILE,
    SUMMARY_FILE,
    MetricsWriter,
    truncate_metrics_after,
    write_json_atomic,
    write_summary_or_say,
)
from ampkit.train.build import RunObjects
from ampkit.train.checkpoint import (  # CheckpointWriteFailed lives next to save_checkpoint; re-exported here
    CheckpointWriteFailed,
    capture_rng_state,
    restore_rng_state,
    save_checkpoint,
)
from ampkit.train.guard import build_guard, checkpoint_is_finite
from ampkit.train.loggers import LoggedMetrics, build_logger
from ampkit.train.signals import StopRequests

SUMMARY_SCHEMA_VERSION = 1
WARMUP_STEPS_EXCLUDED = 2  # first steps carry allocation and kernel set-up: not timed in the summary


@dataclasses.dataclass
class Progress_:
    """Counters that survive a resume (they are checkpoint state)."""

    step: int = 0
    tokens: int = 0
    skipped: int = 0
    first_loss: float | None = None
    last_loss: float | None = None


def run_identity(config) -> dict[str, Any]:
    """What a checkpoint must match to be resumed by this run (checked against its manifest)."""
    return {"model": config.model, "precision": config.precision, "seq_len": config.seq_len, "seed": config.seed}


def checkpoint_payload(objs: RunObjects, state: Progress_) -> dict[str, Any]:
    return {"model": objs.model.state_dict(), "optimizer": objs.optimizer.state_dict(), **run_state(objs, state)}


def run_state(objs: RunObjects, state: Progress_) -> dict[str, Any]:
    """Everything but weights and optimizer state (a sharded checkpoint keeps this per rank)."""
    return {
        "config": dataclasses.asdict(objs.config),
        "model_config": objs.model_config.to_dict(),
        "scheduler": objs.scheduler.state_dict(),
        "precision": objs.policy.state_dict(),
        "sampler": objs.sampler.state_dict(),
        "rng": capture_rng_state(),
        "progress": dataclasses.asdict(state),
    }


def write_checkpoint(objs: RunObjects, run_dir: Path, state: Progress_) -> bool:
    """Save a checkpoint; a failed write (disk full, read-only) stops the run cleanly: training on
    without a safe checkpoint would risk losing everything since the last one. A state holding a
    non-finite weight or optimizer value is never written (returns False): the newest checkpoint
    on disk is always one a rollback or a resume can use. Data-parallel runs write a sharded (DCP)
    checkpoint, every rank its part (ampkit.distributed.checkpoint)."""
    if objs.parallel.distributed:
        return _write_sharded(objs, run_dir, state)
    if not checkpoint_is_finite(objs.model, objs.optimizer):  # sync point (checkpoint steps only)
        return False
    try:
        save_checkpoint(
            run_dir,
            state.step,
            checkpoint_payload(objs, state),
            keep=objs.config.keep_checkpoints,
            identity=run_identity(objs.config),
        )
    except OSError as err:
        raise CheckpointWriteFailed(
            f"checkpoint write at step {state.step} failed ({err.strerror or err}); the previous "
            "checkpoint stays the latest: free disk space or fix permissions, then --resume"
        ) from None
    return True


def _write_sharded(objs: RunObjects, run_dir: Path, state: Progress_) -> bool:
    """`write_checkpoint` for data-parallel runs: every rank calls it at the same step (collectives)."""
    if not all_finite(objs.parallel, objs.model, objs.optimizer):  # agreed by every rank
        return False
    try:
        save_sharded(
            objs.parallel,
            model=objs.model,
            optimizer=objs.optimizer,
            rank_state=run_state(objs, state),
            run_dir=run_dir,
            step=state.step,
            keep=objs.config.keep_checkpoints,
            identity=run_identity(objs.config),
        )
    except OSError as err:
        raise CheckpointWriteFailed(
            f"checkpoint write at step {state.step} failed "
            f"({err.strerror or err}); the previous checkpoint stays the latest: free disk space or "
            "fix permissions, then --resume"
        ) from None
    return True


def restore_from_checkpoint(objs: RunObjects, ckpt: dict[str, Any]) -> Progress_:
    """Load every piece of run state; a shape mismatch is a user error (wrong run directory).
    A sharded checkpoint's weights and optimizer state are already loaded, in place, by
    `ampkit.distributed.checkpoint.load_sharded`; `ckpt` then holds this rank's state."""
    if not objs.parallel.distributed:
        try:
            objs.model.load_state_dict(ckpt["model"])
            objs.optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, KeyError, ValueError) as err:
            first = str(err).strip().splitlines()[0][:160]
            raise UsageError(
                f"checkpoint does not match this model/optimizer ({first}); resume with the same "
                "--model and --precision, or start a new run"
            ) from None
    objs.scheduler.load_state_dict(ckpt["scheduler"])
    objs.policy.load_state_dict(ckpt["precision"])
    objs.sampler.load_state_dict(ckpt["sampler"])
    restore_rng_state(ckpt["rng"])
    return Progress_(**ckpt["progress"])


class StepClock:
    """Wall time per step. On CUDA it synchronizes only when read (a sync point: read at log steps)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.last = self._now()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # sync point: only at log steps
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        elapsed, self.last = now - self.last, now
        return elapsed


def _progress_bar(console: Console, total: int, start: int) -> Progress:
    progress = Progress(
        TextColumn("[bold]train[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    progress.add_task("train", total=total, completed=start, status="")
    return progress


def run_training(
    objs: RunObjects,
    run_dir: Path,
    *,
    ckpt: dict[str, Any] | None = None,
    console: Console | None = None,
    show_progress: bool = True,
    stop_after: int = 0,
) -> dict[str, Any]:
    """Train to `config.steps`, resuming from `ckpt` when given; returns the summary (also written).

    `stop_after` > 0 ends this invocation (with a checkpoint) after that many steps, as a job with
    a time limit would; `ampkit train --resume` continues it with the same schedule."""
    config, trainer = objs.config, objs.trainer
    console = console or Console(stderr=True)
    state = restore_from_checkpoint(objs, ckpt) if ckpt else Progress_()
    log_every = config.log_every or (10 if objs.device.type == "cuda" else 1)
    main = objs.parallel.is_main  # rank 0 alone writes files and shows progress
    if ckpt and main:
        truncate_metrics_after(run_dir / METRICS_FILE, state.step)
    elif main:
        write_json_atomic(run_dir / "config.json", dataclasses.asdict(config))
    timings: list[tuple[float, int]] = []  # (seconds per step, real tokens per step) at log steps
    eval_losses: list[tuple[int, float]] = []
    status, error = "completed", None
    last_step = min(config.steps, state.step + stop_after) if stop_after else config.steps
    guard = build_guard(config, run_dir=run_dir, identity=run_identity(config))  # a do-nothing object when off
    diagnostics = build_train_diagnostics(objs, config)  # no hooks at all when every diagnostic is off
    reset_peak_memory(objs.device)
    started = time.perf_counter()
    with (
        objs.policy.run_context(),
        _metrics_writer(run_dir, append=bool(ckpt), main=main) as jsonl,
        build_logger(
            config.log if main else "none", run_dir=run_dir, resume_step=state.step if ckpt else None
        ) as logger,
        _progress_bar(console, config.steps, state.step) as bar,
        StopRequests() as stops,
    ):
        metrics = LoggedMetrics(jsonl, logger)  # every JSONL record also goes to --log's logger (none: nowhere)
        bar.disable = not (show_progress and main)
        if not ckpt:
            eval_losses.append((0, _evaluate(objs, metrics, 0)))
        guard.ensure_checkpoint(lambda: write_checkpoint(objs, run_dir, state))
        clock, window_tokens, window_steps = StepClock(objs.device), 0, 0
        try:
            while state.step < last_step:
                diagnostics.begin_step(state.step + 1)
                try:
                    result = trainer.train_step()
                except LossScaleCollapse as err:  # re-raised by the guard when it is off
                    state = _rollback(objs, guard, state, state.step + 1, guard.on_collapse(err), metrics, bar)
                    clock.lap()
                    window_tokens = window_steps = 0
                    continue
                state.step += 1
                state.tokens += result.n_tokens
                state.skipped += not result.stepped
                window_tokens += result.n_tokens
                window_steps += 1
                record = None
                if state.step % log_every == 0 or state.step == last_step:
                    seconds = clock.lap()
                    record = _log_record(objs, state, result, seconds, window_steps, window_tokens)
                    metrics.write(record)
                    timings.append((seconds / window_steps, window_tokens / window_steps))
                    if state.first_loss is None:
                        state.first_loss = record["loss"]
                    state.last_loss = record["loss"]
                    bar.update(bar.task_ids[0], completed=state.step, status=_status_text(record))
                    window_tokens = window_steps = 0
                    diagnostics.at_log_step(state.step, metrics)
                if reason := guard.check(result, record):  # host values only: no extra sync
                    state = _rollback(objs, guard, state, state.step, reason, metrics, bar)
                    clock.lap()
                    window_tokens = window_steps = 0
                    continue
                if config.eval_every and state.step % config.eval_every == 0 and state.step < config.steps:
                    eval_losses.append((state.step, _evaluate(objs, metrics, state.step)))
                    clock.lap()  # evaluation time is not step time
                if config.checkpoint_every and state.step % config.checkpoint_every == 0:
                    try:
                        if not write_checkpoint(objs, run_dir, state):
                            metrics.write(
                                {
                                    "event": "checkpoint_skipped",
                                    "step": state.step,
                                    "reason": "non-finite weights or optimizer state",
                                }
                            )
                    except CheckpointWriteFailed as err:
                        if not config.allow_no_checkpoint:
                            raise
                        metrics.write({"event": "checkpoint_failed", "step": state.step, "reason": str(err)})
                        if main:
                            console.print(f"[yellow]warning:[/] {err} (continuing: --allow-no-checkpoint)")
                    clock.lap()
                # Ranks stop at the same step (agreed at log steps), or a checkpoint collective would hang.
                if (signum := objs.parallel.agreed_signal(stops.signum, check=record is not None)) is not None:
                    stops.signum = signum
                    status = "stopped"
                    break
        except TrainingError as err:
            status, error = "failed", str(err)
        finally:
            diagnostics.close()
        eval_losses.append((state.step, _evaluate(objs, metrics, state.step)))
    if status in ("completed", "stopped") and not (
        config.checkpoint_every and state.step % config.checkpoint_every == 0
    ):
        try:
            write_checkpoint(objs, run_dir, state)
        except TrainingError as err:
            status, error = "failed", str(err)
    summary = build_summary(
        objs, state, timings, eval_losses, wall_s=time.perf_counter() - started, status=status, error=error
    )
    summary.update(guard=guard.summary(), diagnostics=diagnostics.summary(), parallel=objs.parallel.describe())
    written = False
    if main and error:  # a failing run's summary when there is room, else a line saying it is missing
        written = write_summary_or_say(run_dir / SUMMARY_FILE, summary, console)
    elif main:
        write_json_atomic(run_dir / SUMMARY_FILE, summary)  # cannot be written: the run fails (WriteFailed)
    if error:
        raise TrainingError(error + (f" (partial summary in {run_dir / SUMMARY_FILE})" if written else ""))
    if status == "stopped":
        name = signal.Signals(stops.signum).name
        raise RunInterrupted(
            f"stopped by {name} at step {state.step} after writing a checkpoint; "
            f"continue with: ampkit train --resume {run_dir}",
            signum=stops.signum,
        )
    return summary


class _NoMetrics:
    """metrics.jsonl on ranks other than 0: records are dropped (rank 0 writes the reduced ones)."""

    def write(self, record: dict[str, Any]) -> None:
        """Dropped."""

    def __enter__(self) -> "_NoMetrics":
        return self

    def __exit__(self, *exc) -> None:
        """Nothing to close."""


def _metrics_writer(run_dir: Path, *, append: bool, main: bool) -> MetricsWriter | _NoMetrics:
    return MetricsWriter(run_dir / METRICS_FILE, append=append) if main else _NoMetrics()


def _rollback(
    objs: RunObjects, guard, state: Progress_, step: int, reason: str, metrics: MetricsWriter, bar
) -> Progress_:
    """The guard restores the last checkpoint; counters continue from it (skips stay counted)."""
    restored = Progress_(**guard.rollback(objs, step=step, reason=reason, metrics=metrics))
    restored.skipped = max(restored.skipped, state.skipped)
    bar.update(bar.task_ids[0], completed=restored.step, status=f"rolled back: {reason}")
    return restored


def _evaluate(objs: RunObjects, metrics: MetricsWriter, step: int) -> float:
    loss = objs.trainer.evaluate(objs.val_batches)
    metrics.write({"event": "eval", "step": step, "eval_loss": loss})
    return loss


def _log_record(objs, state: Progress_, result, seconds: float, steps: int, tokens: int) -> dict[str, Any]:
    scale = objs.policy.loss_scale()
    return {
        "event": "train",
        "step": state.step,
        "loss": objs.parallel.mean(result.loss).item(),  # sync point (log steps only); mean over ranks
        "lr": objs.optimizer.param_groups[0]["lr"],
        "tokens": state.tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else math.inf,
        "step_ms": 1000.0 * seconds / steps,
        "grad_norm": result.grad_norm.item(),
        "loss_scale": scale,
        "skipped": not result.stepped,
        "skipped_total": state.skipped,
        "padding_fraction": 1.0 - result.n_tokens / result.n_slots if result.n_slots else 0.0,
    }


def _status_text(record: dict[str, Any]) -> str:
    text = f"loss {record['loss']:.3f} · {record['tokens_per_s']:,.0f} tok/s"
    if record["loss_scale"] is not None:
        text += f" · scale {record['loss_scale']:g} · skipped {record['skipped_total']}"
    return text


def build_summary(
    objs: RunObjects, state: Progress_, timings, eval_losses, *, wall_s: float, status: str, error: str | None
) -> dict[str, Any]:
    """The run's `summary.json` (schema version SUMMARY_SCHEMA_VERSION; fields documented in docs/)."""
    measured = timings[WARMUP_STEPS_EXCLUDED:] or timings
    step_s = [s for s, _ in measured]
    tokens = [t for _, t in measured]
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "command": "train",
        "ampkit_version": __version__,
        "status": status,
        "error": error,
        "config": dataclasses.asdict(objs.config),
        "device": {"type": objs.device.type, "name": objs.device_info.name},
        "warnings": objs.warnings,
        "model": {"preset": objs.model_config.name, "parameters": objs.model_config.num_parameters()},
        "data": {"corpus": objs.corpus_name},
        "steps": state.step,
        "tokens": state.tokens,
        "first_loss": state.first_loss,
        "final_loss": state.last_loss,
        "eval_loss_initial": eval_losses[0][1] if eval_losses and eval_losses[0][0] == 0 else None,
        "eval_loss": eval_losses[-1][1] if eval_losses else None,
        "eval_history": [{"step": s, "eval_loss": v} for s, v in eval_losses],
        "tokens_per_s": sum(tokens) / sum(step_s) if step_s and sum(step_s) > 0 else None,
        "step_ms_median": 1000.0 * statistics.median(step_s) if step_s else None,
        "skipped_steps": state.skipped,
        "final_loss_scale": objs.policy.loss_scale(),
        "peak_memory": peak_memory_bytes(objs.device),
        "throughput": objs.features_summary(),
        "wall_s": wall_s,
    }
