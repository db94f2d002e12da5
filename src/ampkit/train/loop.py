"""A whole training run: steps, logging, evaluation, checkpoints, summary.

Host-device syncs happen only at log, eval and checkpoint steps (`log_every` is 1 on CPU, where a
sync is free, and 10 on CUDA by default) -- plus the one GradScaler itself makes per step in fp16.
The run never asks whether it is distributed or which precision it has: the checkpointer, the
guard, the diagnostics and `objs.parallel` were chosen when the run was built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ampkit import __version__
from ampkit.core.signals import StopRequests
from ampkit.diagnostics.train_hooks import build_train_diagnostics
from ampkit.errors import RunDiverged, RunInterrupted, TrainingError, WriteFailed
from ampkit.hardware.backend import backend_for
from ampkit.memory import peak_memory_bytes, reset_peak_memory
from ampkit.precision import LossScaleCollapse
from ampkit.provenance import device_text, provenance
from ampkit.runs import (
    METRICS_FILE,
    SUMMARY_FILE,
    MetricsWriter,
    say,
    summary_marks_write_failure,
    truncate_metrics_after,
    write_json_atomic,
    write_summary_or_say,
)
from ampkit.tasks import optional
from ampkit.train.build import RunObjects
from ampkit.train.checkpointer import CheckpointWriteFailed, RunProgress, run_identity  # noqa: F401 (re-exported)
from ampkit.train.guard import build_guard
from ampkit.train.loggers import LoggedMetrics, Logger, NullLogger, build_logger
from ampkit.train.rank_times import gather_rank_times

if TYPE_CHECKING:
    from ampkit.core.step import StepResult
    from ampkit.diagnostics.train_hooks import NoDiagnostics, TrainDiagnostics
    from ampkit.train.config import TrainConfig

    Diagnostics = TrainDiagnostics | NoDiagnostics

SUMMARY_SCHEMA = "ampkit.train/1"
SUMMARY_SCHEMA_VERSION = 1
WARMUP_STEPS_EXCLUDED = 2  # first steps carry allocation and kernel set-up: not timed in the summary


class RunStatus(enum.Enum):
    """How a run ended (`summary.json`'s "status")."""

    COMPLETED = "completed"
    STOPPED = "stopped"  # a signal: checkpoint written, resumable
    FAILED = "failed"  # a TrainingError: e.g. a checkpoint write failed, the guard gave up
    DIVERGED = "diverged"  # non-finite loss or a collapsed loss scale, no --guard


class Cadence:
    """Which steps log, evaluate and checkpoint."""

    def __init__(self, config: TrainConfig, *, device: torch.device, last_step: int) -> None:
        self.config, self.last_step = config, last_step
        self.log_every = config.log.log_every or (10 if backend_for(device).asynchronous else 1)  # a log is a sync

    def logs(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.last_step

    def evaluates(self, step: int) -> bool:
        every = self.config.eval.eval_every
        return bool(every) and step % every == 0 and step < self.config.steps  # the end always evaluates

    def checkpoints(self, step: int) -> bool:
        every = self.config.checkpoint.checkpoint_every
        return bool(every) and step % every == 0


class StepClock:
    """Wall time per step. On an accelerator it synchronizes only when read (a sync point: read at log steps)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.synchronize = backend_for(device).synchronize  # chosen once: a no-op on CPU
        self.last = self._now()

    def _now(self) -> float:
        self.synchronize()  # sync point on an accelerator: only at log steps
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        elapsed, self.last = now - self.last, now
        return elapsed


class ThroughputWindow:
    """Steps, trained and processed items since the last log step, and their wall time (evaluation,
    checkpoint writes and rollbacks are cut out with `restart`)."""

    def __init__(self, device: torch.device):
        self.clock = StepClock(device)
        self.steps = self.tokens = self.processed = 0
        self.timings: list[tuple[float, float, float]] = []
        """(seconds per step, trained items per step, processed items per step) of each closed window"""
        self.last_processed = 0
        """the processed items of the window `close` ended last"""
        self.images = self.last_images = 0
        """image tokens among the processed items (a VLM's): of this window, of the one `close` ended"""
        self.image_timings: list[float] = []
        """image tokens per step of each closed window (beside `timings`)"""

    def add(self, n_tokens: int, n_processed: int | None = None, n_image_tokens: int = 0) -> None:
        self.steps += 1
        self.tokens += n_tokens
        self.processed += n_tokens if n_processed is None else n_processed
        self.images += n_image_tokens

    def close(self) -> tuple[float, int, int]:
        """(seconds, steps, trained items) of the window now ending (`last_processed`: its processed
        items); a new one starts."""
        seconds, steps, tokens = self.clock.lap(), self.steps, self.tokens
        self.timings.append((seconds / steps, tokens / steps, self.processed / steps))
        self.image_timings.append(self.images / steps)
        self.last_processed, self.last_images = self.processed, self.images
        self.steps = self.tokens = self.processed = self.images = 0
        return seconds, steps, tokens

    def restart(self) -> None:
        """Drop the time since the last lap (it was not step time)."""
        self.clock.lap()
        self.steps = self.tokens = self.processed = self.images = 0


class _NoMetrics:
    """metrics.jsonl on ranks other than 0: records are dropped (rank 0 writes the reduced ones)."""

    def write(self, record: dict[str, Any]) -> None:
        """Dropped."""

    def __enter__(self) -> _NoMetrics:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to close."""


def _progress_bar(console: Console, total: int, start: int, *, enabled: bool) -> Progress:
    """The train bar. `enabled` is fixed here: a Progress disabled after it started never stops its
    refresh thread (rich's `stop` is a no-op once `disable` is set), which then outlives the run."""
    progress = Progress(
        TextColumn("[bold]train[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not enabled,
    )
    progress.add_task("train", total=total, completed=start, status="")
    return progress


def run_training(
    objs: RunObjects,
    run_dir: Path,
    *,
    resume: bool = False,
    console: Console | None = None,
    show_progress: bool = True,
    stop_after: int = 0,
) -> dict[str, Any]:
    """Train to `config.steps` (continuing from the newest checkpoint with `resume`); returns the
    summary (also written). `stop_after` > 0 ends this invocation (with a checkpoint) after that
    many steps, as a job with a time limit would; `ampkit train --resume` continues it with the
    same schedule."""
    return _Run(
        objs,
        Path(run_dir),
        resume=resume,
        console=console or Console(stderr=True),
        show_progress=show_progress,
        stop_after=stop_after,
    ).execute()


class _Run:
    """One invocation of a run: its progress, cadence, guard, diagnostics and outcome."""

    def __init__(
        self, objs: RunObjects, run_dir: Path, *, resume: bool, console: Console, show_progress: bool, stop_after: int
    ):
        self.objs, self.config, self.run_dir, self.resume = objs, objs.config, run_dir, resume
        self.console, self.main = console, objs.parallel.is_main  # rank 0 alone writes files and shows progress
        self.show_progress = show_progress and self.main
        self.checkpointer = objs.checkpointer
        self.progress = self.checkpointer.resume(objs, run_dir) if resume else RunProgress()
        last = min(self.config.steps, self.progress.step + stop_after) if stop_after else self.config.steps
        self.cadence = Cadence(self.config, device=objs.device, last_step=last)
        self.guard = build_guard(  # chosen once
            self.config.guard,
            doctor_args=self.config.doctor_args(),
            checkpointer=self.checkpointer,
            run_dir=run_dir,
            parallel=objs.parallel,
        )
        self.eval_losses: list[tuple[int, float]] = []
        self.status = RunStatus.COMPLETED
        self.error: str | None = None
        self.signum: int | None = None

    def execute(self) -> dict[str, Any]:
        self._prepare_run_dir()
        logger = self._build_logger()
        try:
            summary, written = self._train_and_summarize(logger)
        except BaseException:  # an unexpected error, or a summary that could not be written
            logger.close("failed")
            raise
        logger.close(self.status.value)  # after summary.json and report.html: a tracker keeps them as artifacts
        self._raise_outcome(summary_written=written)
        return summary

    def _build_logger(self) -> Logger:
        """`--log`'s loggers (rank 0 alone logs); a resumed run shows no step twice."""
        if not self.main:
            return NullLogger()
        return build_logger(
            self.config.log,
            run_dir=self.run_dir,
            resume_step=self.progress.step if self.resume else None,
            config=self.config,
            console=self.console,
        )

    def _train_and_summarize(self, logger: Logger) -> tuple[dict[str, Any], bool]:
        """Train, then write the summary and the report; (the summary, whether a failing run's was written)."""
        # no hooks at all when every one is off
        diagnostics = build_train_diagnostics(self.objs, self.config.guard, micro_batches=self.config.grad_accum)
        reset_peak_memory(self.objs.device)
        started = time.perf_counter()
        window = ThroughputWindow(self.objs.device)
        with self._streams(logger) as (metrics, bar):
            try:
                self._loop(metrics, bar, window, diagnostics)
            except RunDiverged as err:
                self.status, self.error = RunStatus.DIVERGED, str(err)
            except TrainingError as err:
                self.status, self.error = RunStatus.FAILED, str(err)
            finally:
                diagnostics.close()
            if self.status is not RunStatus.DIVERGED:  # a diverged model's held-out loss says nothing
                self.eval_losses.append((self.progress.step, self._evaluate(metrics, self.progress.step)))
        self._final_checkpoint()
        ranks = gather_rank_times(  # every rank, or none: completed and stopped are agreed by all ranks
            self.objs.parallel,
            [s for s, _, _ in window.timings[WARMUP_STEPS_EXCLUDED:] or window.timings],
            agreed=self.status in (RunStatus.COMPLETED, RunStatus.STOPPED),
        )
        summary = build_summary(
            self.objs,
            self.progress,
            window.timings,
            self.eval_losses,
            image_timings=window.image_timings,
            wall_s=time.perf_counter() - started,
            status=self.status.value,
            error=self.error,
        )
        summary.update(
            guard=self.guard.summary(), diagnostics=diagnostics.summary(), parallel=self.objs.parallel.describe()
        )
        summary["ranks"] = ranks  # None in one process, or where the ranks did not all finish
        return summary, self._write_summary(summary)

    def _write_summary(self, summary: dict[str, Any]) -> bool:
        """summary.json and report.html (rank 0); whether a failing run's summary was written."""
        written = False
        if self.main and self.error:  # a failing run's summary when there is room, else a line saying so
            written = write_summary_or_say(self.run_dir / SUMMARY_FILE, summary, self.console)
            if written:
                self._write_report_or_say(summary)
        elif self.main:
            write_json_atomic(self.run_dir / SUMMARY_FILE, summary)  # cannot be written: the run fails (WriteFailed)
            with summary_marks_write_failure(self.run_dir, "train", self.console):  # as bench's, doctor's, plan's
                _write_report(summary, self.run_dir)
        return written

    def _prepare_run_dir(self) -> None:
        if not self.main:
            return
        if self.resume:
            truncate_metrics_after(self.run_dir / METRICS_FILE, self.progress.step)
            self.console.print(f"resuming {self.run_dir} at step {self.progress.step}")
        else:
            write_json_atomic(self.run_dir / "config.json", dataclasses.asdict(self.config))

    @contextlib.contextmanager
    def _streams(self, logger: Logger) -> Iterator[tuple[LoggedMetrics, Progress]]:
        """The run's contexts: precision flags, metrics (+ `logger`, which `execute` closes), progress bar,
        signal handling."""
        jsonl = MetricsWriter(self.run_dir / METRICS_FILE, append=self.resume) if self.main else _NoMetrics()
        bar = _progress_bar(self.console, self.config.steps, self.progress.step, enabled=self.show_progress)
        with self.objs.policy.run_context(), jsonl, bar, StopRequests() as stops:
            self.stops = stops
            yield LoggedMetrics(jsonl, logger), bar  # every JSONL record also goes to --log's loggers

    def _loop(self, metrics: LoggedMetrics, bar: Progress, window: ThroughputWindow, diagnostics: Diagnostics) -> None:
        if not self.resume:
            self.eval_losses.append((0, self._evaluate(metrics, 0)))
        self.guard.ensure_checkpoint(lambda: self.checkpointer.save(self.objs, self.run_dir, self.progress))
        window.restart()
        while self.progress.step < self.cadence.last_step:
            diagnostics.begin_step(self.progress.step + 1)
            record = self._step(metrics, bar, window, diagnostics)
            if record is False:  # rolled back: the step did not count
                window.restart()
                continue
            self._after_step(metrics, window)
            # Ranks stop at the same step (agreed at log steps), or a checkpoint collective would hang.
            signum = self.objs.parallel.agreed_signal(self.stops.signum, check=record is not None)
            if signum is not None:
                self.status, self.signum = RunStatus.STOPPED, signum
                return

    def _step(
        self, metrics: LoggedMetrics, bar: Progress, window: ThroughputWindow, diagnostics: Diagnostics
    ) -> dict[str, Any] | bool | None:
        """One optimizer step and its log record (None off log steps); False when the guard rolled back."""
        state = self.progress
        try:
            result = self.objs.trainer.train_step()
        except LossScaleCollapse as err:
            self._recover(state.step + 1, self.guard.on_collapse(err), metrics, bar)
            return False
        state.step += 1
        state.tokens += result.n_tokens
        state.skipped += not result.stepped
        window.add(result.n_tokens, result.n_processed, result.n_image_tokens)
        record = None
        if self.cadence.logs(state.step):
            closed = window.close()
            record = _log_record(
                self.objs, state, result, *closed, processed=window.last_processed, images=window.last_images
            )
            metrics.write(record)
            state.first_loss = record["loss"] if state.first_loss is None else state.first_loss
            state.last_loss = record["loss"]
            bar.update(bar.task_ids[0], completed=state.step, status=_status_text(record, self.objs.task.unit))
            diagnostics.at_log_step(state.step, metrics)
        # host values only; under --parallel one flag all-reduce (the guard's, every rank at every step)
        if reason := self.guard.check(result, record):
            self._recover(state.step, reason, metrics, bar)
            return False
        return record

    def _recover(self, step: int, reason: str, metrics: LoggedMetrics, bar: Progress) -> None:
        """The guard rolls back (counters continue from the checkpoint; skips stay counted), or,
        without `--guard`, ends the run as diverged (`RunDiverged`)."""
        restored = self.guard.recover(self.objs, step=step, reason=reason, metrics=metrics)
        restored.skipped = max(restored.skipped, self.progress.skipped)
        self.progress = restored
        bar.update(bar.task_ids[0], completed=restored.step, status=f"rolled back: {reason}")

    def _after_step(self, metrics: LoggedMetrics, window: ThroughputWindow) -> None:
        step = self.progress.step
        if self.cadence.evaluates(step):
            self.eval_losses.append((step, self._evaluate(metrics, step)))
            window.restart()  # evaluation time is not step time
        if self.cadence.checkpoints(step):
            self._periodic_checkpoint(metrics)
            window.restart()

    def _periodic_checkpoint(self, metrics: LoggedMetrics) -> None:
        step = self.progress.step
        try:
            if not self.checkpointer.save(self.objs, self.run_dir, self.progress):
                metrics.write(
                    {"event": "checkpoint_skipped", "step": step, "reason": "non-finite weights or optimizer state"}
                )
        except CheckpointWriteFailed as err:
            if not self.config.checkpoint.allow_no_checkpoint:
                raise
            metrics.write({"event": "checkpoint_failed", "step": step, "reason": str(err)})
            if self.main:
                self.console.print(f"[yellow]warning:[/] {err} (continuing: --allow-no-checkpoint)")

    def _final_checkpoint(self) -> None:
        """Completed and stopped runs end on a checkpoint (unless this step already has one)."""
        if self.status not in (RunStatus.COMPLETED, RunStatus.STOPPED) or self.cadence.checkpoints(self.progress.step):
            return
        try:
            self.checkpointer.save(self.objs, self.run_dir, self.progress)
        except TrainingError as err:
            self.status, self.error = RunStatus.FAILED, str(err)

    def _write_report_or_say(self, summary: dict[str, Any]) -> None:
        """A failing run's report when there is room; its own error is the message that matters."""
        try:
            _write_report(summary, self.run_dir)
        except WriteFailed as err:
            say(f"note: the report could not be written ({err.reason})", self.console)

    def _raise_outcome(self, *, summary_written: bool) -> None:
        if self.error:
            where = f" (partial summary in {self.run_dir / SUMMARY_FILE})" if summary_written else ""
            raise type_for(self.status)(self.error + where)
        if self.status is RunStatus.STOPPED and self.signum is not None:
            name = signal.Signals(self.signum).name
            raise RunInterrupted(
                f"stopped by {name} at step {self.progress.step} after writing a checkpoint; "
                f"continue with: ampkit train --resume {self.run_dir}",
                signum=self.signum,
            )

    def _evaluate(self, metrics: LoggedMetrics, step: int) -> float:
        loss = self.objs.trainer.evaluate(self.objs.val_batches)
        metrics.write({"event": "eval", "step": step, "eval_loss": loss})
        return loss


def _write_report(summary: dict[str, Any], run_dir: Path) -> None:
    from ampkit.train.report import write_train_report  # matplotlib: loaded once the run is over

    write_train_report(summary, run_dir)


def type_for(status: RunStatus) -> type[TrainingError]:
    """The exception a run that ended with `status` raises (both exit 1)."""
    return RunDiverged if status is RunStatus.DIVERGED else TrainingError


def _parameters(model: torch.nn.Module) -> int:
    """Distinct parameter elements (a tied weight once; a sharded one by its full shape)."""
    return sum(p.numel() for p in model.parameters())


def _log_record(
    objs: RunObjects,
    state: RunProgress,
    result: StepResult,
    seconds: float,
    steps: int,
    tokens: int,
    *,
    processed: int,
    images: int = 0,
) -> dict[str, Any]:
    """One step's metrics.jsonl line; tokens_per_s: the task's trained items/s (tokens with a loss),
    processed_tokens_per_s: the items read (masked ones too), what MFU would count; a VLM's also
    image_tokens_per_s: the image tokens among the processed ones (read, never trained)."""
    images_per_s = {"image_tokens_per_s": images / seconds if seconds > 0 else math.inf} if images else {}
    return {
        "event": "train",
        "step": state.step,
        "loss": objs.parallel.mean(result.loss).item(),  # sync point (log steps only); mean over ranks
        "lr": objs.optimizer.param_groups[0]["lr"],
        "tokens": state.tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else math.inf,  # the task's items/s (name kept)
        "processed_tokens_per_s": processed / seconds if seconds > 0 else math.inf,
        "step_ms": 1000.0 * seconds / steps,
        "grad_norm": result.grad_norm.item(),
        "loss_scale": objs.policy.loss_scale(),
        "skipped": not result.stepped,
        "skipped_total": state.skipped,
        "padding_fraction": 1.0 - result.n_processed / result.n_slots if result.n_slots else 0.0,
        **images_per_s,
    }


def _status_text(record: dict[str, Any], unit: str) -> str:
    """The bar's text: its rate is the last log window's (the summary's is the whole run's, `build_summary`)."""
    trained, processed = record["tokens_per_s"], record["processed_tokens_per_s"]
    text = f"loss {record['loss']:.3f} · {trained:,.0f} {unit}/s (last window)"
    if processed != trained:  # masked prompts: what was read beside what was trained
        text += f" · {processed:,.0f} processed/s"
    if record["loss_scale"] is not None:
        text += f" · scale {record['loss_scale']:g} · skipped {record['skipped_total']}"
    return text


def build_summary(
    objs: RunObjects,
    state: RunProgress,
    timings: list[tuple[float, float, float]],
    eval_losses: list[tuple[int, float]],
    *,
    image_timings: list[float] | None = None,
    wall_s: float,
    status: str,
    error: str | None,
) -> dict[str, Any]:
    """The run's `summary.json` (schema version SUMMARY_SCHEMA_VERSION; fields documented in docs/)."""
    measured = timings[WARMUP_STEPS_EXCLUDED:] or timings
    step_s = [s for s, _, _ in measured]
    tokens = [t for _, t, _ in measured]
    processed = [p for _, _, p in measured]
    items_per_s = sum(tokens) / sum(step_s) if step_s and sum(step_s) > 0 else None
    processed_per_s = sum(processed) / sum(step_s) if step_s and sum(step_s) > 0 else None
    images = (image_timings or [])[WARMUP_STEPS_EXCLUDED:] or (image_timings or [])
    image_per_s = sum(images) / sum(step_s) if any(images) and step_s and sum(step_s) > 0 else None
    return {
        "schema": SUMMARY_SCHEMA,
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "command": "train",
        "ampkit_version": __version__,
        "provenance": provenance(device=device_text(objs.device_info), config=dataclasses.asdict(objs.config)),
        "status": status,
        "error": error,
        "config": dataclasses.asdict(objs.config),
        "device": {"type": objs.device.type, "name": objs.device_info.name},
        "warnings": objs.warnings,
        "task": optional.describe(objs.task),
        "unit": objs.task.unit,
        "model": {"preset": objs.task.name, "parameters": _parameters(objs.model)},
        "data": {
            "corpus": optional.describe(objs.task).get("corpus"),
            "format": optional.describe(objs.task).get("data_format"),
        },
        "steps": state.step,
        "tokens": state.tokens,
        "first_loss": state.first_loss,
        "final_loss": state.last_loss,
        "eval_loss_initial": eval_losses[0][1] if eval_losses and eval_losses[0][0] == 0 else None,
        "eval_loss": eval_losses[-1][1] if eval_losses else None,
        "eval_history": [{"step": s, "eval_loss": v} for s, v in eval_losses],
        "items_per_s": items_per_s,
        "tokens_per_s": items_per_s if objs.task.unit == "tokens" else None,
        "processed_per_s": processed_per_s,
        "image_tokens_per_s": image_per_s,
        "step_ms_median": 1000.0 * statistics.median(step_s) if step_s else None,
        "skipped_steps": state.skipped,
        "final_loss_scale": objs.policy.loss_scale(),
        "peak_memory": peak_memory_bytes(objs.device),
        "throughput": objs.features_summary(),
        "lora": objs.lora.to_dict() if objs.lora is not None else None,
        "wall_s": wall_s,
    }
