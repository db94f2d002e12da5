"""The bench's live display on stderr: one bar per precision, fed by the workers' progress events, and a
first row with the bench's expected time left (`session.BenchSession` sets it once fp32's warmup is timed)."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, ClassVar, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ampkit.bench.budget import PrecisionPlan
from ampkit.bench.config import BenchConfig


class Planned(Protocol):
    """What the display reads of the bench's plan (`runner.BenchPlan`)."""

    @property
    def precisions(self) -> list[str]: ...
    @property
    def task(self) -> dict[str, Any]: ...
    @property
    def config(self) -> BenchConfig: ...


class BenchProgress:
    """One bar per precision on stderr, fed by the workers' progress events, and a first row with the
    bench's expected time left; `enabled=False` is silent."""

    _PHASES: ClassVar[dict[str, str]] = {
        "build": "building",
        "fidelity": "fidelity capture",
        "warmup": "warmup (untimed)",
        "profile": "profiling one step",
        "probe": "timing its GEMMs in the other dtypes",
    }

    def __init__(self, console: Console, plan: Planned, *, enabled: bool) -> None:
        self.plan = plan
        self.progress = Progress(
            TextColumn("[bold]{task.description:<11}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self.total = self.progress.add_task("bench", total=None, status="time left: estimated after fp32's warmup")
        self.tasks = {name: self.progress.add_task(name, total=1.0, status="waiting") for name in plan.precisions}
        self.expected_end: float | None = None
        self._context = self.progress if enabled else nullcontext()

    def __enter__(self) -> BenchProgress:
        self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)

    def set_expected_end(self, when: float) -> None:
        self.expected_end = when
        self._tick()

    def _tick(self) -> None:
        if self.expected_end is not None:
            left = max(0.0, self.expected_end - time.perf_counter())
            self.progress.update(self.total, status=f"~{left:.0f} s left (expected)")

    def start(self, name: str, job_plan: PrecisionPlan | None) -> None:
        if job_plan is not None and not job_plan.timed:
            self.progress.update(self.tasks[name], status="fidelity only (not timed)")

    def update(self, name: str, event: dict) -> None:
        task = self.tasks[name]
        kind = event.get("event")
        if kind == "phase":
            self.progress.update(task, status=self._PHASES.get(event.get("phase", ""), "measuring"))
        elif kind == "step":
            self.progress.update(task, completed=self._fraction(event), status=self._step_text(event))
        elif kind == "reduced":
            self.progress.update(task, status=f"batch reduced to {event.get('batch_size')}")
        self._tick()

    def _fraction(self, event: dict) -> float:
        config = self.plan.config
        _, most = config.measured_steps_range
        if config.steps:
            return event["measured"] / most
        left = event.get("left_s")
        if left is not None:
            done = event["elapsed_s"] / max(1e-9, event["elapsed_s"] + left)
            return min(0.99, max(done, event["measured"] / most))
        return min(0.99, max(event["elapsed_s"] / config.budget_s, event["measured"] / most))

    def _step_text(self, event: dict) -> str:
        rate = event.get("tokens", 0) / event["elapsed_s"] if event.get("elapsed_s") else 0.0
        unit = self.plan.task.get("unit", "tokens")
        short = {"tokens": "tok", "samples": "samples"}.get(unit, unit)
        left = f" · {event['left_s']:.0f} s left" if event.get("left_s") is not None else ""
        # every measured step so far, stalls included: the summary's figure excludes stalled steps
        return f"{event['measured']} steps · {rate:,.0f} {short}/s (so far){left}"

    def finish(self, name: str, result: dict) -> None:
        status = {"ok": "done", "not-timed": "fidelity only (not timed)", "interrupted": "[yellow]interrupted[/]"}.get(
            result["status"], "[red]failed[/]"
        )
        self.progress.update(self.tasks[name], completed=1.0, status=status)
        self._tick()
