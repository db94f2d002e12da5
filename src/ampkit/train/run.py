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
from ampkit.errors import RunInterrupted, TrainingError, UsageError
from ampkit.memory import peak_memory_bytes, reset_peak_memory
from ampkit.runs import METRICS_FILE, SUMMARY_FILE, MetricsWriter, truncate_metrics_after, write_json_atomic
from ampkit.train.build import RunObjects
from ampkit.train.signals import StopRequests
from ampkit.train.checkpoint import capture_rng_state, restore_rng_state, save_checkpoint

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
    return {
        "config": dataclasses.asdict(objs.config),
        "model_config": objs.model_config.to_dict(),
        "model": objs.model.state_dict(),
        "optimizer": objs.optimizer.state_dict(),
        "scheduler": objs.scheduler.state_dict(),
        "precision": objs.policy.state_dict(),
        "sampler": objs.sampler.state_dict(),
        "rng": capture_rng_state(),
        "progress": dataclasses.asdict(state),
    }


def write_checkpoint(objs: RunObjects, run_dir: Path, state: Progress_) -> None:
    """Save a checkpoint; a failed write (disk full, read-only) stops the run cleanly: training on
    without a safe checkpoint would risk losing everything since the last one."""
    try:
        save_checkpoint(run_dir, state.step, checkpoint_payload(objs, state), keep=objs.config.keep_checkpoints,
                        identity=run_identity(objs.config))
    except OSError as err:
        raise TrainingError(f"checkpoint write at step {state.step} failed ({err.strerror or err}); the previous "
                            "checkpoint stays the latest: free disk space or fix permissions, then --resume") from None


def restore_from_checkpoint(objs: RunObjects, ckpt: dict[str, Any]) -> Progress_:
    """Load every piece of run state; a shape mismatch is a user error (wrong run directory)."""
    try:
        objs.model.load_state_dict(ckpt["model"])
        objs.optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, KeyError, ValueError) as err:
        first = str(err).strip().splitlines()[0][:160]
        raise UsageError(f"checkpoint does not match this model/optimizer ({first}); resume with the same "
                         "--model and --precision, or start a new run") from None
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
        TextColumn("[bold]train[/]"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=console, transient=False,
    )
    progress.add_task("train", total=total, completed=start, status="")
    return progress


def run_training(objs: RunObjects, run_dir: Path, *, ckpt: dict[str, Any] | None = None,
                 console: Console | None = None, show_progress: bool = True,
                 stop_after: int = 0) -> dict[str, Any]:
    """Train to `config.steps`, resuming from `ckpt` when given; returns the summary (also written).

    `stop_after` > 0 ends this invocation (with a checkpoint) after that many steps, as a job with
    a time limit would; `ampkit train --resume` continues it with the same schedule."""
    config, trainer = objs.config, objs.trainer
    console = console or Console(stderr=True)
    state = restore_from_checkpoint(objs, ckpt) if ckpt else Progress_()
    log_every = config.log_every or (10 if objs.device.type == "cuda" else 1)
    if ckpt:
        truncate_metrics_after(run_dir / METRICS_FILE, state.step)
    else:
        write_json_atomic(run_dir / "config.json", dataclasses.asdict(config))
    timings: list[tuple[float, int]] = []  # (seconds per step, real tokens per step) at log steps
    eval_losses: list[tuple[int, float]] = []
    status, error = "completed", None
    last_step = min(config.steps, state.step + stop_after) if stop_after else config.steps
    reset_peak_memory(objs.device)
    started = time.perf_counter()
    with objs.policy.run_context(), MetricsWriter(run_dir / METRICS_FILE, append=bool(ckpt)) as metrics, \
            _progress_bar(console, config.steps, state.step) as bar, StopRequests() as stops:
        bar.disable = not show_progress
        if not ckpt:
            eval_losses.append((0, _evaluate(objs, metrics, 0)))
        clock, window_tokens, window_steps = StepClock(objs.device), 0, 0
        try:
            while state.step < last_step:
                result = trainer.train_step()
                state.step += 1
                state.tokens += result.n_tokens
                state.skipped += not result.stepped
                window_tokens += result.n_tokens
                window_steps += 1
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
                if config.eval_every and state.step % config.eval_every == 0 and state.step < config.steps:
                    eval_losses.append((state.step, _evaluate(objs, metrics, state.step)))
                    clock.lap()  # evaluation time is not step time
                if config.checkpoint_every and state.step % config.checkpoint_every == 0:
                    write_checkpoint(objs, run_dir, state)
                    clock.lap()
                if stops.signum is not None:
                    status = "stopped"
                    break
        except TrainingError as err:
            status, error = "failed", str(err)
        eval_losses.append((state.step, _evaluate(objs, metrics, state.step)))
    if status in ("completed", "stopped") and not (config.checkpoint_every and state.step % config.checkpoint_every == 0):
        try:
            write_checkpoint(objs, run_dir, state)
        except TrainingError as err:
            status, error = "failed", str(err)
    summary = build_summary(objs, state, timings, eval_losses, wall_s=time.perf_counter() - started,
                            status=status, error=error)
    write_json_atomic(run_dir / SUMMARY_FILE, summary)
    if error:
        raise TrainingError(f"{error} (partial summary in {run_dir / SUMMARY_FILE})")
    if status == "stopped":
        name = signal.Signals(stops.signum).name
        raise RunInterrupted(f"stopped by {name} at step {state.step} after writing a checkpoint; "
                             f"continue with: ampkit train --resume {run_dir}", signum=stops.signum)
    return summary


def _evaluate(objs: RunObjects, metrics: MetricsWriter, step: int) -> float:
    loss = objs.trainer.evaluate(objs.val_batches)
    metrics.write({"event": "eval", "step": step, "eval_loss": loss})
    return loss


def _log_record(objs, state: Progress_, result, seconds: float, steps: int, tokens: int) -> dict[str, Any]:
    scale = objs.policy.loss_scale()
    return {
        "event": "train",
        "step": state.step,
        "loss": result.loss.item(),  # sync point (log steps only)
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


def build_summary(objs: RunObjects, state: Progress_, timings, eval_losses, *, wall_s: float, status: str,
                  error: str | None) -> dict[str, Any]:
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
        "wall_s": wall_s,
    }
