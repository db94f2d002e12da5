"""`ampkit bench` end to end: check everything up front, run one worker process per precision
(fp32 first), then compare, recommend, write summary.json and the reports.

Everything a user can get wrong (unknown precision, a budget <= 0, tf32 on a CPU, a model too big
for the device, an output directory that exists) is refused here before any worker starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console

from ampkit.bench.budget import PrecisionPlan
from ampkit.bench.candidates import candidate_overrides, candidate_spec, check_candidate_overrides
from ampkit.bench.config import BenchConfig, parse_precisions, resolve_for_device
from ampkit.bench.memory_check import check_bench_fits, largest_batch, predict_step_peak
from ampkit.bench.parallel import BenchParallel, stop_hung, with_reduce_dtypes
from ampkit.bench.peaks import measure_peaks
from ampkit.bench.progress import BenchProgress
from ampkit.bench.session import BenchSession
from ampkit.bench.summary import build_summary
from ampkit.bench.zygote import ForkedWorker, Zygote, start_worker, warm_workers
from ampkit.core.signals import StopRequests
from ampkit.errors import RunInterrupted, TrainingError, UsageError, WriteFailed
from ampkit.hardware import DeviceInfo, describe_device, pick_device
from ampkit.lora.build import check_lora_available
from ampkit.precision import REFERENCE
from ampkit.runs import (
    SUMMARY_FILE,
    create_run_dir,
    make_dir,
    remove_quietly,
    summary_marks_write_failure,
    write_failed,
    write_json_atomic,
)
from ampkit.tasks import optional
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.load import build_task

if TYPE_CHECKING:
    from ampkit.tasks import Task

WORKERS_DIR = "workers"
"""0: every worker a fresh process, never forked from the warm one (`bench.zygote`)"""
BUSY_LOAD_PER_CPU = 2.0  # a load average above this many runnable processes per CPU earns a warning
MIN_WORKER_TIMEOUT_S = 900.0  # hang protection only: a slow emulated precision still finishes within it


@dataclass(frozen=True, kw_only=True)
class BenchPlan:
    """A checked bench: resolved config, device, the task and the precisions in run order."""

    config: BenchConfig
    info: DeviceInfo
    precisions: list[str]
    warnings: list[str]
    task: dict[str, Any]
    """the task's description (`ampkit.tasks.optional.describe`): name, unit, parameters, ..."""
    task_pickle: str | None = None
    """a pickled task object for the workers (the Python API), or None: they build it from config.task"""
    requested: tuple[str, ...] = ()
    """the precisions `--precisions` named (an emulated one among them is timed, not skipped)"""
    task_object: Any = None
    """the task built for the checks (the planner's predictions use it)"""


def plan_bench(config: BenchConfig, *, task_object: Task | None = None) -> BenchPlan:
    """Resolve "auto" settings for the device and refuse what cannot run, before any worker starts:
    the task is built here once (a missing task file, a bad model or --seq-len is one line, exit 2)."""
    info = describe_device(pick_device(config.device))
    resolved, names, warnings = resolve_for_device(config, info)
    names = with_reduce_dtypes(names, resolved.parallel)  # --reduce-dtypes: a candidate per reduce dtype
    resolved = dataclasses.replace(resolved, precisions=",".join(names))
    corpus = resolved.data.data
    if corpus != "default" and not Path(corpus).exists():
        raise UsageError(
            f"--data {corpus} does not exist; pass a .txt/.md/.jsonl file or a folder, "
            "or leave --data out for the embedded corpus"
        )
    for name in names:  # peft present; nf4 runs on this device at each precision's compute dtype
        check_lora_available(resolved.lora, device=torch.device(info.type), precision=name)
    task = task_object if task_object is not None else build_task(resolved.task_spec())
    check_overrides(resolved, names, task)
    if isinstance(task, LanguageModelTask):  # the planner's ledger, before any worker (language models)
        check_bench_fits(resolved, names, device=torch.device(info.type))
    return BenchPlan(
        config=resolved,
        info=info,
        precisions=names,
        warnings=warnings,
        task=optional.describe(task),
        requested=tuple(parse_precisions(config.precisions)[1:] if config.precisions else ()),
        task_object=task,
    )


def check_overrides(config: BenchConfig, names: list[str], task: Task) -> None:
    """The candidates' module patterns against the task's model, built on the meta device (no memory):
    a pattern matching no module is one line before any worker starts. A model that cannot be built
    there is left to the workers, whose policy resolves the same patterns."""
    if not config.keep_fp32 and not any(candidate_overrides(n) for n in names):
        return
    try:
        with torch.device("meta"):
            model = task.build_model(device=torch.device("meta"), seed=config.seed)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return
    check_candidate_overrides(names, keep_fp32=config.keep_fp32, model=model)


def main_script() -> str | None:
    """The running script's path (a pickled task may refer to its classes as `__main__.NAME`)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return str(Path(path).resolve()) if path and str(path).endswith(".py") else None


def pickle_task(task: Task, folder: Path) -> Path:
    """The task object, pickled for the workers (each precision runs in a fresh process)."""
    path = folder / "task.pkl"
    try:
        path.write_bytes(pickle.dumps(task))
    except (pickle.PicklingError, AttributeError, TypeError) as err:
        raise UsageError(
            f"task {task.name}: bench runs each precision in a fresh process and must pickle the task object, which "
            f"failed ({type(err).__name__}: {err}); define its functions at module level, or pass the task as "
            "'FILE.py:FACTORY'"
        ) from None
    return path


def host_load() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages (runnable processes), where the OS reports them."""
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None


def busy_host_warning(load: dict) -> list[str]:
    """Other processes competing for the CPUs inflate and scatter step times: say so in the report.
    The bench's own worker accounts for up to ~one runnable thread per core, hence the 2x margin."""
    end = load["end"]
    if not end or not load["cpus"] or end[0] <= BUSY_LOAD_PER_CPU * load["cpus"]:
        return []
    return [
        f"the host was busy while measuring (1-minute load average {end[0]:.1f} on {load['cpus']} CPUs): "
        "other processes competed for the cores, so step times are inflated and noisy; re-run on an idle "
        "machine for figures to quote"
    ]


def worker_timeout_s(config: BenchConfig, expected_s: float | None = None) -> float:
    """Hang protection only: far beyond what the budget's plan expects of the worker."""
    return max(MIN_WORKER_TIMEOUT_S, 20.0 * config.budget_s, 4.0 * (expected_s or 0.0))


class WorkerSlot:
    """The worker process running now, so that a stop signal reaches it: a terminal's Ctrl-C reaches
    the whole process group, `kill -INT BENCH_PID` (or SIGTERM from a scheduler) only the bench."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | ForkedWorker | None = None
        self.signum: int | None = None

    def interrupt(self, signum: int) -> None:
        """Called from the signal handler: pass the signal on to the running worker."""
        self.signum = signum
        self._forward()

    def hold(self, proc: subprocess.Popen | ForkedWorker | None) -> None:
        self.proc = proc
        if proc is not None and self.signum is not None:  # the signal came while it was starting
            self._forward()

    def _forward(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None and self.signum is not None:
            with contextlib.suppress(OSError):  # it ended meanwhile
                proc.send_signal(self.signum)


def run_worker(
    job_path: Path,
    log_path: Path,
    *,
    on_event: Callable[[dict], None],
    timeout_s: float,
    slot: WorkerSlot | None = None,
    parallel: BenchParallel | None = None,
    zygote: Zygote | None = None,
) -> str | None:
    """Run one worker process to completion; returns None, or why it died without a result.
    `slot` holds the process while it runs (a stop signal is passed on to it). `parallel`: the worker
    is torchrun's launcher of that many ranks (`bench.parallel.worker_command`). `zygote`: the worker is
    forked from that warm process (`bench.zygote`), or started cold where it cannot give one."""
    parallel = parallel or BenchParallel()
    try:
        log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (its OSError is reported alone; `with log` closes it)
    except OSError as err:
        raise write_failed(log_path, err) from None
    slot = slot or WorkerSlot()
    with log:
        proc = start_worker(job_path, log, parallel, zygote)
        slot.hold(proc)
        assert proc.stdout is not None  # stdout=PIPE
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            stop_hung(proc, distributed=parallel.distributed)

        watchdog = threading.Timer(timeout_s, kill)
        watchdog.start()
        try:
            for line in proc.stdout:  # progress events, one JSON object per line
                try:
                    on_event(json.loads(line))
                except json.JSONDecodeError:
                    log.write(line)  # stray prints land in the log, not on the console
        finally:
            watchdog.cancel()
            code = proc.wait()
            slot.hold(None)
    if slot.signum is not None:
        name = signal.Signals(slot.signum).name
        clean_interrupted_log(log_path, name)
        return f"interrupted by {name} before it finished"
    if timed_out.is_set():
        return f"no result after {timeout_s:g} s, far past what its budget plan expected; killed as hung (see its log)"
    if code < 0:
        return f"worker killed by signal {-code} (signal 9 is usually the out-of-memory killer)"
    return None


def clean_interrupted_log(log_path: Path, name: str) -> None:
    """A worker stopped by a signal says so in one line; a traceback it printed while starting up
    (the signal arrived before its handler was installed) is cut off: it tells nothing."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
        start = text.find("Traceback (most recent call last):")
        if start < 0 or "KeyboardInterrupt" not in text[start:]:
            return
        log_path.write_text(text[:start] + f"ampkit bench worker: interrupted by {name}\n", encoding="utf-8")
    except OSError:
        pass  # a log we cannot rewrite keeps what it has


def _last_log_line(log_path: Path) -> str:
    lines = [line.strip() for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "no output")[:300]


def measure_precision(
    name: str,
    plan: BenchPlan,
    run_dir: Path,
    progress: BenchProgress,
    *,
    job_plan: PrecisionPlan | None = None,
    on_event: Callable[[dict], None] | None = None,
    slot: WorkerSlot | None = None,
    zygote: Zygote | None = None,
) -> dict[str, Any]:
    """One worker for `name`: writes workers/<name>.json (the job) and reads back <name>.result.json
    (status "interrupted" when a stop signal ended the worker first). `zygote`: fork it from there."""
    slot = slot or WorkerSlot()
    workers = run_dir / WORKERS_DIR
    paths = {
        key: workers / f"{name}.{suffix}"
        for key, suffix in (("job", "job.json"), ("result", "result.json"), ("log", "log"), ("fidelity", "fidelity.pt"))
    }
    reference = candidate_spec(name).is_reference
    worker_plan = _worker_plan(job_plan, reference=reference) if job_plan is not None else None
    write_json_atomic(
        paths["job"],
        {
            "config": plan.config.to_dict(),
            "precision": name,
            "reference": reference,
            "plan": worker_plan,
            "spawned_at": time.time(),
            "result_path": str(paths["result"]),
            "fidelity_path": str(paths["fidelity"]),
            "task_pickle": plan.task_pickle,
            "main_path": main_script()
            if plan.task_pickle and b"__main__" in Path(plan.task_pickle).read_bytes()
            else None,
        },
    )
    progress.start(name, job_plan)

    def event(message: dict) -> None:
        progress.update(name, message)
        if on_event is not None:
            on_event(message)

    expected = job_plan.estimated_total_s if job_plan is not None else None
    spawned = time.perf_counter()
    timeout_s, ranks = worker_timeout_s(plan.config, expected), plan.config.parallel
    death = run_worker(
        paths["job"], paths["log"], on_event=event, timeout_s=timeout_s, slot=slot, parallel=ranks, zygote=zygote
    )
    result = _read_result(name, paths, death, worker_plan, interrupted=slot.signum is not None)
    result["worker_s"] = time.perf_counter() - spawned  # the process, from its spawn to its exit
    rel: dict[str, str | None] = {key: str(path.relative_to(run_dir)) for key, path in paths.items() if key != "job"}
    rel["fidelity"] = rel["fidelity"] if paths["fidelity"].is_file() else None
    result["files"] = rel
    result["job_plan"] = job_plan.to_dict() if job_plan is not None else None
    progress.finish(name, result)
    return result


def _worker_plan(job_plan: PrecisionPlan, *, reference: bool) -> dict[str, Any]:
    rows = [job_plan.fidelity_rows] + ([1] if reference and job_plan.fidelity_rows != 1 else [])
    return {
        "probe": dict(job_plan.probe),
        "mode": job_plan.mode,
        "batch_size": job_plan.batch_size,
        "fidelity_rows": rows,
        "max_measure_s": job_plan.max_measure_s,
        "reason": job_plan.reason,
        "may_reduce": job_plan.mode != "exact-steps",
    }


def _read_result(
    name: str,
    paths: dict[str, Path],
    death: str | None,
    worker_plan: dict[str, Any] | None,
    *,
    interrupted: bool = False,
) -> dict[str, Any]:
    if paths["result"].is_file():
        return json.loads(paths["result"].read_text(encoding="utf-8"))
    why = death or f"worker exited without a result ({_last_log_line(paths['log'])})"
    return {
        "precision": name,
        "status": "interrupted" if interrupted else "failed",
        "error": why,
        "error_kind": "interrupted" if interrupted else ("killed" if death else "error"),
        "plan": worker_plan,
    }


def _refuse_without_reference(result: dict[str, Any]) -> None:
    """fp32 is the yardstick: without it nothing can be compared, so the bench stops."""
    error = result["error"]
    message = f"{REFERENCE} (the reference) failed: {error}; see {result['files']['log']}"
    if result.get("error_kind") in ("oom", "usage") or "killed by signal 9" in error:
        raise UsageError(message)  # the user can fix it: smaller shapes, other data, an extra installed
    if result.get("error_kind") == "write":  # disk full, read-only: the summary says so (exit 1)
        raise WriteFailed(result["files"]["log"], error, message=message)
    raise TrainingError(message)


def run_bench(
    config: BenchConfig,
    *,
    out: str | Path | None = None,
    console: Console | None = None,
    show_progress: bool = True,
    task_object: Task | None = None,
    started: float | None = None,
) -> tuple[dict[str, Any], Path]:
    """The whole bench; returns (summary, run directory). The reports are written too. `task_object`:
    a task given as a Python object (`ampkit.bench.run`), pickled for the worker processes. `started`:
    the `time.perf_counter()` the bench's wall time counts from (the command's process start; now by
    default). summary.json is written before the reports, then again with `budget.finished_s` (the
    wall time with the reports drawn: what the expected time promised), which no report shows.

    SIGINT/SIGTERM stop the running worker; the precisions finished are written (summary.json
    `"status": "interrupted"`, the reports), then `RunInterrupted` is raised (exit 128 + signal)."""
    from ampkit.bench.report import render_report  # matplotlib: loaded only once there is something to draw

    console = console or Console(stderr=True)
    started, load_start = (time.perf_counter() if started is None else started), host_load()
    plan = plan_bench(config, task_object=task_object)
    run_dir = create_run_dir(out, "bench")
    slot = WorkerSlot()
    with summary_marks_write_failure(run_dir, "bench", console), StopRequests(on_stop=slot.interrupt) as stops:
        summary = _measure_all(
            plan,
            run_dir,
            console,
            show_progress=show_progress,
            started=started,
            load_start=load_start,
            task_object=task_object,
            slot=slot,
        )
        render_report(summary, run_dir)
        if summary.get("budget") is not None:
            summary["budget"]["finished_s"] = time.perf_counter() - started
            write_json_atomic(run_dir / SUMMARY_FILE, summary)
    if summary["status"] == "interrupted":
        stopped = summary["interrupted"]
        finished = ", ".join(stopped["finished"]) or "none"
        raise RunInterrupted(
            f"interrupted by {stopped['signal']} "
            + (f"during {stopped['during']}" if stopped["during"] else "between precisions")
            + f" (precisions finished: {finished}); what was measured is in {run_dir / SUMMARY_FILE}",
            signum=stops.signum or signal.SIGINT,
        )
    return summary, run_dir


def _measure_all(
    plan: BenchPlan,
    run_dir: Path,
    console: Console,
    *,
    show_progress: bool,
    started: float,
    load_start: list | None,
    task_object: Task | None = None,
    slot: WorkerSlot | None = None,
) -> dict[str, Any]:
    """The device's matmul peaks, every precision's worker (`BenchSession`), then summary.json (returned).
    A stop signal (`slot`) ends the session after the worker it stopped."""
    slot = slot or WorkerSlot()
    make_dir(run_dir / WORKERS_DIR)
    if task_object is not None:
        plan = dataclasses.replace(plan, task_pickle=str(pickle_task(task_object, run_dir / WORKERS_DIR)))
    write_json_atomic(run_dir / "config.json", plan.config.to_dict())
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)  # one line, never folded
    device = pick_device(plan.config.device)
    peaks = measure_peaks(plan.info, plan.precisions, device)
    session, results = _run_session(plan, run_dir, console, peaks, device, show_progress, started, slot)
    load = {"cpus": os.cpu_count() or 0, "start": load_start, "end": host_load()}
    budget = session.budget_block(results, wall_s=time.perf_counter() - started)
    interrupted = _interrupted_block(slot, results)
    summary = build_summary(
        config=plan.config,
        info=plan.info,
        task=plan.task,
        results=results,
        warnings=plan.warnings + busy_host_warning(load),
        run_dir=run_dir,
        wall_s=time.perf_counter() - started,
        host_load=load,
        peaks=peaks,
        predict=lambda name, batch, seq: predict_step_peak(
            plan.config, plan.task_object, name, batch_size=batch, seq_len=seq
        ),
        fit_batch=lambda name: largest_batch(plan.config, plan.task_object, name, device=device),
        budget=budget,
        interrupted=interrupted,
    )
    if not plan.config.keep_tensors:
        drop_fidelity_tensors(run_dir, summary)
    write_json_atomic(run_dir / SUMMARY_FILE, summary)
    return summary


def _run_session(
    plan: BenchPlan,
    run_dir: Path,
    console: Console,
    peaks: dict[str, Any],
    device: torch.device,
    show_progress: bool,
    started: float,
    slot: WorkerSlot,
) -> tuple[BenchSession, list[dict[str, Any]]]:
    """Every precision's worker, in `BenchSession`'s order, forked from a warm process where one can be had."""
    workers = run_dir / WORKERS_DIR
    with (
        warm_workers(device_type=device.type, distributed=plan.config.parallel.distributed, workers=workers) as zygote,
        BenchProgress(console, plan, enabled=show_progress) as progress,
    ):
        session = BenchSession(
            plan,
            console,
            progress,
            peaks,
            started=started,
            measure=lambda name, job_plan, on_event: measure_precision(
                name, plan, run_dir, progress, job_plan=job_plan, on_event=on_event, slot=slot, zygote=zygote
            ),
            stopped=lambda: slot.signum is not None,
            warm_start=zygote is not None,
        )
        return session, session.run(_refuse_without_reference)


def _interrupted_block(slot: WorkerSlot, results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """summary["interrupted"]: the signal, the precision it stopped, the precisions finished before it."""
    if slot.signum is None:
        return None
    stopped = next((r["precision"] for r in results if r["status"] == "interrupted"), None)
    return {
        "signal": signal.Signals(slot.signum).name,
        "during": stopped,
        "finished": [r["precision"] for r in results if r["status"] != "interrupted"],
    }


def drop_fidelity_tensors(run_dir: Path, summary: dict[str, Any]) -> None:
    """The fidelity captures (`workers/*.fidelity*.pt`, megabytes each) have been compared and
    summary.json holds the result: delete them (`--keep-tensors` keeps them)."""
    for path in (run_dir / WORKERS_DIR).glob("*.fidelity*.pt"):
        remove_quietly(path)
    for entry in summary["precisions"]:
        entry["files"]["fidelity"] = None
