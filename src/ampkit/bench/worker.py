"""One precision, measured in its own fresh process: `python -m ampkit.bench.worker JOB.json`.

A fresh process per precision means its peak memory is its own and no state (allocator caches,
autocast caches, TF32 flags, oneDNN primitives) leaks from one precision into the next.

Order of work (the parent relies on it):
    build (device check -> data -> model -> policy -> optimizer; same seed = same weights and batches)
    -> fidelity capture at the initial weights on a fixed held-out batch (written to a .pt file; fp32
       also on its first row alone, for precisions whose 4-row capture would not fit the budget)
    -> [a "not-timed" plan ends here] -> untimed warmup steps, the last under torch.profiler (the step's
       time by category and its memory peak, `bench.profile`); a first step beyond the budget reduces
       the batch -> a "warm" event (the step time the parent plans with) -> measured steps in the
       budget's window (`bench.budget.measure_window`) -> peak memory reading.
The job's "plan" (`bench.budget.PrecisionPlan`, from the parent) sets the batch, the fidelity rows and
the most the measured window may take; the device's peak FLOP/s are measured by the parent.
Under `bench --nproc-per-node N --parallel ddp|fsdp` (`bench.parallel`) torchrun starts this module
as N ranks: every rank builds, captures and steps (the collectives need them all), every decision
that depends on a clock is rank 0's, broadcast (the warmup's length, a reduced batch, the end of the
measured window: ranks that disagreed would wait for each other forever), and rank 0 alone reports
(progress, the fidelity capture, the result). Step results count every rank's tokens.
Progress goes to stdout as JSON lines (the parent draws the bars); the result goes to the job's
`result_path` as JSON, also when the run fails (status "failed" and a one-line error).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

# A stop (the parent passes SIGINT/SIGTERM on) can reach this process while it still imports torch: Python's
# default SIGINT handler would raise KeyboardInterrupt inside torch's C++ initialisation, which aborts the
# process ("terminate called after throwing an instance of 'pybind11::error_already_set'"). Until `main`
# installs its own handlers, a stop is only recorded here, and `main` ends with it before any work. Only when
# run as the worker (`python -m ampkit.bench.worker`): importing this module never changes a process's handlers.
_EARLY_STOP: list[int] = []
if __name__ == "__main__":
    for _signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_signum, lambda signum, frame: _EARLY_STOP.append(signum))

import torch

from ampkit.bench.budget import FULL_FIDELITY_ROWS, Window, measure_window, reduced_batch, warmup_plan
from ampkit.bench.candidates import candidate_overrides, candidate_reduce, split_candidate
from ampkit.bench.config import BenchConfig
from ampkit.bench.fidelity import capture_fidelity, fidelity_file, fixed_batch
from ampkit.bench.gemm_probe import Gemm, probe_ratios
from ampkit.bench.profile import profile_step
from ampkit.bench.timing import make_step_timer, synchronize
from ampkit.config import replace_settings, resolve_config
from ampkit.core.signals import STOP_SIGNALS
from ampkit.distributed.context import launch_env, rank_error
from ampkit.distributed.sampler import RankShardedSampler
from ampkit.errors import TrainingError, UsageError, WriteFailed
from ampkit.memory import peak_memory_bytes, reset_peak_memory
from ampkit.runs import atomic_write, write_json_atomic
from ampkit.sections import EvalSection, OptimizerSection, ParallelSection
from ampkit.shutdown import end_process
from ampkit.tasks import optional
from ampkit.tasks.flops import flops_per_item
from ampkit.train import TrainConfig, build_run

if TYPE_CHECKING:
    from types import FrameType

    from ampkit.core.step import StepResult, Trainer
    from ampkit.tasks import Task
    from ampkit.train import RunObjects

STARTED = {"how": "cold"}
"""how this worker process started: "cold" (`python -m ampkit.bench.worker`), or "forked" from the bench's warm
process (`bench.zygote` sets it in the child)"""
LR_WARMUP_STEPS = 10  # the LR schedule's warmup; the same in every precision (not the timing warmup)
PROGRESS_EVERY_S = 0.25  # at most ~4 progress lines a second on stdout
PROBE_SHARE = 0.1  # fp32's GEMM probe may take this share of the budget per dtype (`bench.gemm_probe`)


class ProgressEmitter:
    """JSON lines on stdout for the parent's progress bar; step lines are rate-limited."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._last = 0.0

    @classmethod
    def for_rank(cls, rank: int) -> ProgressEmitter:
        """Rank 0's emitter on stdout; another rank's says nothing (the parent draws one bar per precision)."""
        return cls() if rank == 0 else Silent()

    def emit(self, event: str, *, force: bool = True, **fields: Any) -> None:
        now = time.perf_counter()
        if not force and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        self.stream.write(json.dumps({"event": event, **fields}) + "\n")
        self.stream.flush()


class Silent(ProgressEmitter):
    """The emitter of a rank other than 0: every event dropped."""

    def emit(self, event: str, *, force: bool = True, **fields: Any) -> None:
        return None


def train_config_for(config: BenchConfig, name: str) -> TrainConfig:
    """The training run a bench worker performs: the same for every candidate but its precision (and
    the optimizer a candidate such as 'bf16-true+adamw-sr' names, AdamW otherwise; the module overrides
    of 'bf16-mixed@vision=fp32', with bench's `--keep-fp32`). Bench's `[model]`, `[data]` and `[lora]`
    sections are train's own, handed over whole."""
    precision, optimizer = split_candidate(name)
    _, max_steps = config.measured_steps_range
    return TrainConfig(
        precision=precision,
        module_precision=str(candidate_overrides(name)),
        keep_fp32=config.keep_fp32,
        model=config.model,
        data=config.data,
        device=config.device,
        steps=config.warmup_steps + max_steps,  # the LR schedule spans the longest possible run
        optimizer=OptimizerSection(optimizer=optimizer or "adamw", lr=config.lr, warmup_steps=LR_WARMUP_STEPS),
        seed=config.seed,
        eval=EvalSection(eval_batches=1),
        fit_check=False,  # the parent checked every precision before any worker started
        lora=config.lora,  # --lora: the base stored as this precision implies, fp32 adapters
        # bench --parallel: this candidate's sharding and reduce dtype; torchrun started the ranks (nproc 0 here)
        parallel=ParallelSection(parallel=config.parallel.parallel, reduce_dtype=candidate_reduce(name)),
    )


def load_pickled_task(path: str | None, main_path: str | None = None) -> Task | None:
    """The task object the Python API pickled for the workers (`ampkit.bench.run(task)`), or None.

    Classes and functions of the parent's own script pickle as `__main__.NAME`: as multiprocessing's
    spawn does, the script is imported first as `__mp_main__` and stands in for `__main__` (its
    `if __name__ == "__main__":` block does not run)."""
    if path is None:
        return None
    if main_path:
        _import_main_script(main_path)
    with open(path, "rb") as fh:
        return pickle.load(fh)


def _import_main_script(path: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    spec.loader.exec_module(module)
    sys.modules["__main__"] = module


def current_rss_bytes() -> int:
    """Resident memory right now (Linux /proc/self/statm); 0 where unreadable."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def _timed_step(trainer: Trainer, device: torch.device) -> tuple[StepResult, float]:
    """One untimed-loop step with its wall time (a sync on CUDA: warmup only)."""
    start = time.perf_counter()
    result = trainer.train_step()
    synchronize(device)
    return result, time.perf_counter() - start


def agreed(objs: RunObjects, value: Any) -> Any:
    """Rank 0's `value` on every rank (a broadcast; one process: `value`): decisions made on a clock."""
    return objs.parallel.broadcast_object(value)


def use_stream(objs: RunObjects, *, batch_size: int, seed: int) -> None:
    """Train on the task's stream at `batch_size` from here on; under `--parallel` dealt to the ranks
    as `train.build.build_run_data` deals it (rank r takes batches r, r + W, ...: every rank's counted)."""
    stream = objs.task.train_stream(batch_size=batch_size, seed=seed)
    run = objs.parallel
    if run.distributed:
        stream = RankShardedSampler(stream, rank=run.rank, world_size=run.world_size, count=objs.task.count)
        run.sampler = stream  # type: ignore[attr-defined]  # a distributed run's is a ProcessGroupRun
    objs.trainer.sampler = stream


def _reduce_batch(
    objs: RunObjects, config: BenchConfig, plan: dict[str, Any], step_s: float, emit: ProgressEmitter
) -> None:
    """One step overran the budget: go on with a batch whose step takes a fraction of it, and say so."""
    batch = plan["batch_size"]
    smaller = reduced_batch(batch, step_s, config.budget_s)
    if smaller >= batch:
        return
    use_stream(objs, batch_size=smaller, seed=config.seed)
    plan["batch_size"], plan["mode"] = smaller, "reduced-batch"
    plan["reason"] = (
        f"reduced batch {smaller} (of {batch}): one step took {step_s:.1f} s > --budget-s {config.budget_s:g}"
    )
    emit.emit("reduced", batch_size=smaller, reason=plan["reason"])


def warm_up(objs: RunObjects, config: BenchConfig, plan: dict[str, Any], emit: ProgressEmitter) -> dict[str, Any]:
    """Untimed steps, the last one profiled (`bench.profile`): a cold step, then as many as the budget
    affords (`budget.warmup_plan`). A step beyond the budget reduces the batch (not under --steps): the
    cold first one only when over twice the budget (it pays one-time costs), else a steady one, after
    which one more untimed step measures the reduced batch's step time. fp32's worker then times the
    profiled step's GEMMs in the other precisions' dtypes (`plan["probe"]`, `bench.gemm_probe`)."""
    trainer, device = objs.trainer, objs.device
    may_reduce = plan["mode"] != "exact-steps" and plan.get("may_reduce", True)
    emit.emit("phase", phase="warmup")
    began = time.perf_counter()
    first, first_s = _timed_step(trainer, device)
    first_s = agreed(objs, first_s)  # every rank takes as many warmup steps, reduces the batch alike
    results, times = [first], [first_s]
    if may_reduce and first_s > 2 * config.budget_s:
        _reduce_batch(objs, config, plan, first_s, emit)
    total = warmup_plan(first_s, warmup_steps=config.warmup_steps, budget_s=config.budget_s)
    while len(results) < total - 1:
        result, seconds = _timed_step(trainer, device)
        results.append(result)
        times.append(seconds)
    emit.emit("phase", phase="profile")
    profiled_batch = plan["batch_size"]
    profiled, profile, step_peak = profile_step(trainer, device=device, record_shapes=bool(plan.get("probe")))
    gemms = [Gemm.from_list(row) for row in profile.pop("gemms", [])]
    results.append(profiled)
    profiled_slots = profiled.n_slots
    step_s = agreed(objs, times[-1] if len(times) > 1 else profile["step_ms"] / 1e3)
    if may_reduce and step_s > config.budget_s and plan["batch_size"] > 1:
        _reduce_batch(objs, config, plan, step_s, emit)
        result, step_s = _timed_step(trainer, device)
        step_s = agreed(objs, step_s)
        results.append(result)
    plan["warmup_s"] = time.perf_counter() - began  # the steps only: the probe below is fp32's alone
    probe_began = time.perf_counter()
    if plan.get("probe"):
        emit.emit("phase", phase="probe")
    probe = (plan.get("probe") or {}) if objs.parallel.is_main else {}  # rank 0's GEMMs stand for every rank's
    ratios = probe_ratios(gemms, probe, device, max_s=PROBE_SHARE * config.budget_s)
    plan["probe_s"] = time.perf_counter() - probe_began
    return {
        "results": results,
        "profile": profile,
        "step_peak_bytes": step_peak,
        "step_s": step_s,
        "first_s": first_s,
        "matmul_ratios": {key: found["ratio"] for key, found in ratios.items()},
        "profiled_batch_size": profiled_batch,
        "profiled_slots": profiled_slots,
    }


def measure_steps(objs: RunObjects, config: BenchConfig, emit: ProgressEmitter, plan: dict[str, Any]) -> dict[str, Any]:
    """Warmup (the last step profiled), then timed steps in the budget's window (`budget.measure_window`)."""
    trainer, device = objs.trainer, objs.device
    warm = warm_up(objs, config, plan, emit)
    results, step_s = list(warm["results"]), warm["step_s"]
    emit.emit(
        "warm",
        step_s=step_s,
        batch_size=plan["batch_size"],
        warmup_steps=len(results),
        matmul_share=warm["profile"]["shares"]["matmul"],
        startup_s=plan["startup_s"],
        imports_s=plan.get("imports_s"),
        fidelity_s=plan["fidelity_s"],
        first_s=warm["first_s"],
        warmup_s=plan["warmup_s"],
        matmul_ratios=warm["matmul_ratios"],
    )
    lo, hi = config.measured_steps_range
    if config.steps:
        window = Window(timed_s=math.inf, min_steps=hi, few_steps=False)
    else:
        window = measure_window(step_s, budget_s=config.budget_s, min_steps=lo, max_measure_s=plan["max_measure_s"])
    synchronize(device)  # the measured window starts with an idle device
    timer = make_step_timer(device)
    start = time.perf_counter()
    measured = tokens = 0
    last_s = step_s
    emit.emit("phase", phase="measure")
    while measured < hi and agreed(objs, window.keep_going(measured, time.perf_counter() - start, last_s)):
        began = time.perf_counter()
        timer.start()
        results.append(trainer.train_step())
        timer.stop()
        measured += 1
        tokens += results[-1].n_tokens
        now = time.perf_counter()
        last_s = now - began
        left = max(0.0, window.timed_s - (now - start)) if math.isfinite(window.timed_s) else (hi - measured) * last_s
        emit.emit("step", force=measured == hi, measured=measured, tokens=tokens, elapsed_s=now - start, left_s=left)
    return _step_facts(objs, results, warm, timer.seconds(), window)


def _step_facts(
    objs: RunObjects, results: list, warm: dict[str, Any], step_s: list[float], window: Window
) -> dict[str, Any]:
    warmup = len(warm["results"])
    measured_results = results[warmup:]
    losses = torch.stack([r.loss.float() for r in results]).cpu().tolist()  # one sync for the whole run
    grad_norms = torch.stack([_whole(r.grad_norm).float() for r in results]).cpu().tolist()
    return {
        "warmup_steps": warmup,
        "measured_steps": len(measured_results),
        "step_s": step_s,
        "tokens": [r.n_tokens for r in measured_results],
        "slots": [r.n_slots for r in measured_results],
        "processed": [r.n_processed for r in measured_results],
        "image_tokens": [r.n_image_tokens for r in measured_results],
        "loss_curve": losses,
        "skipped_steps": sum(not r.stepped for r in results),
        "nonfinite_loss_steps": sum(not math.isfinite(v) for v in losses),
        "nonfinite_grad_steps": sum(not math.isfinite(v) for v in grad_norms),
        "final_loss_scale": objs.policy.loss_scale(),
        "few_steps": window.few_steps,
        "few_steps_reason": window.reason,
        "profile": warm["profile"],
        "step_peak_bytes": warm["step_peak_bytes"],
        "profiled_slots": warm["profiled_slots"],
        "profiled_batch_size": warm["profiled_batch_size"],
        "estimated_step_s": warm["step_s"],
    }


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor: FSDP2's gradient norm is a DTensor (replicated: its full tensor is the local one)."""
    full = getattr(tensor, "full_tensor", None)
    return full() if full is not None else tensor


def memory_reading(device: torch.device, rss_before: int) -> dict[str, Any]:
    """Peak memory of this process's run. CPU: peak RSS (interpreter and torch included) and its
    growth over the RSS before the model was built. An accelerator: the caching allocator's maxima."""
    peak = peak_memory_bytes(device)
    if device.type != "cpu":
        return {
            "kind": device.type,
            "peak_bytes": peak["max_allocated_bytes"],
            **peak,
            "run_bytes": peak["max_allocated_bytes"],
        }
    rss = peak["max_rss_bytes"]
    return {
        "kind": "cpu-rss",
        "peak_bytes": rss,
        "max_rss_bytes": rss,
        "baseline_rss_bytes": rss_before,
        "run_bytes": max(0, rss - rss_before),
    }


def default_plan(config: BenchConfig) -> dict[str, Any]:
    """A job without a budget plan (`bench --sweep`): the bench's batch, min steps kept within 2x the budget."""
    return {
        "mode": "exact-steps" if config.steps else "full",
        "batch_size": config.data.batch_size,
        "fidelity_rows": [FULL_FIDELITY_ROWS],
        "max_measure_s": 2 * config.budget_s,
        "reason": None,
    }


def capture_all(objs: RunObjects, job: dict[str, Any], rows_list: list[int]) -> dict[str, Any]:
    """The fidelity captures at the initial weights (fp32: 4 rows and 1, for the precisions whose
    4-row capture would not fit the budget); returns the main capture's batch and the seconds spent."""
    start = time.perf_counter()
    batch = None
    for rows in rows_list:
        cut = fixed_batch(objs.val_batches, rows=rows).to(objs.device)
        batch = batch if batch is not None else cut
        capture = capture_fidelity(model=objs.model, policy=objs.policy, batch=cut, task=objs.task)
        capture["rows"] = rows
        if not objs.parallel.is_main:  # every rank captures (forward and backward are collective); rank 0 writes
            continue
        with atomic_write(fidelity_file(job["fidelity_path"], rows, rows_list[0])) as fh:  # WriteFailed on error
            torch.save(capture, fh)
    synchronize(objs.device)
    return {"batch": batch, "fidelity_s": time.perf_counter() - start}


def build_for(job: dict[str, Any], config: BenchConfig, plan: dict[str, Any]) -> RunObjects:
    """The run at the bench's batch (held-out batches, hence the fidelity batch, are the same in every
    precision); a plan's smaller batch replaces the training stream only."""
    train_config = train_config_for(config, job["precision"])
    if job.get("features"):  # `bench --sweep`: one combination of throughput switches, the candidate's optimizer
        switches = dict(job["features"])  # flat names: [features]'s and [optimizer]'s optimizer
        if split_candidate(job["precision"])[1]:  # a candidate's own optimizer wins over the sweep's
            switches["optimizer"] = train_config.optimizer.optimizer
        train_config = replace_settings(train_config, switches, source="the sweep's switches")
    objs = build_run(train_config, task=load_pickled_task(job.get("task_pickle"), job.get("main_path")))
    if plan["batch_size"] != config.data.batch_size:
        use_stream(objs, batch_size=plan["batch_size"], seed=config.seed)
    return objs


def run_job(job: dict[str, Any], emit: ProgressEmitter) -> dict[str, Any]:
    """Build, measure, and write the result (rank 0); under `--parallel` the ranks then part (a barrier
    after a clean run, `ProcessGroupRun.close`), so a rank's result is on disk before any peer leaves."""
    config = resolve_config(BenchConfig, base=job["config"], base_source="the bench job")  # sections too ([lora])
    plan = {**default_plan(config), **(job.get("plan") or {})}
    plan["imports_s"] = time.time() - job.get("spawned_at", time.time())  # process start and imports
    plan["started"] = STARTED["how"]
    rss_before = current_rss_bytes()
    emit.emit("phase", phase="build")
    objs = build_for(job, config, plan)
    clean = False
    try:
        result = measure_built(objs, job, config, plan, emit, rss_before=rss_before)
        if objs.parallel.is_main:
            write_json_atomic(job["result_path"], result)
        clean = True
    finally:
        objs.parallel.close(clean=clean)
    return result


def measure_built(
    objs: RunObjects,
    job: dict[str, Any],
    config: BenchConfig,
    plan: dict[str, Any],
    emit: ProgressEmitter,
    *,
    rss_before: int,
) -> dict[str, Any]:
    """The fidelity capture, FLOPs per item (the reference), the steps and the memory reading of a built run."""
    reset_peak_memory(objs.device)
    facts: dict[str, Any] = {}
    with objs.policy.run_context():
        plan["startup_s"] = time.time() - job.get("spawned_at", time.time())
        emit.emit("phase", phase="fidelity")
        captured = capture_all(objs, job, list(plan["fidelity_rows"]))
        plan["fidelity_s"] = captured["fidelity_s"]
        if job.get("reference", True):  # FLOPs per item: the reference's count serves every precision
            facts = flops_per_item(
                objs.task, objs.model, captured["batch"], batch_size=config.data.batch_size, policy=objs.policy
            ).to_dict()
        if plan["mode"] != "not-timed":
            facts.update(measure_steps(objs, config, emit, plan))
    base = {
        "precision": job["precision"],
        "status": "ok" if plan["mode"] != "not-timed" else "not-timed",
        "error": None,
        "threads": torch.get_num_threads(),
        "fidelity_path": job["fidelity_path"],
        "fidelity_rows": plan["fidelity_rows"][0],
        "plan": {k: v for k, v in plan.items() if k != "fidelity_rows"},
        "unit": objs.task.unit,
        "parameters": sum(p.numel() for p in objs.model.parameters()),  # distinct elements (ties once)
        "task": optional.describe(objs.task),
        "parallel": objs.parallel.describe(),  # mode, world size (and backend, reduce dtype under --parallel)
    }
    if plan["mode"] == "not-timed":
        return base
    memory = memory_reading(objs.device, rss_before)
    memory["rank_peak_bytes"] = objs.parallel.all_gather_object(memory["peak_bytes"])  # every rank's, rank order
    return {**base, **facts, "memory": memory, "throughput": objs.features_summary()}


def describe_failure(err: BaseException) -> tuple[str, str]:
    """(kind, one line saying what went wrong and what to change); kind is "oom", "usage", "write"
    (a file could not be written: disk full, read-only) or "error"."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    if isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text:
        return "oom", f"out of memory ({text}); lower --batch-size or --seq-len, or pick a smaller --model"
    if isinstance(err, WriteFailed):
        return "write", text
    if isinstance(err, UsageError):
        return "usage", text
    if isinstance(err, TrainingError):
        return "error", text
    return "error", f"{type(err).__name__}: {text}"


class WorkerStopped(BaseException):
    """SIGINT/SIGTERM reached the worker (the parent passes a stop on): it ends without a result.
    A BaseException, so that no `except Exception` on the way turns it into a failure."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: FrameType | None) -> None:
    raise WorkerStopped(signum)


def _stopped(signum: int) -> int:
    """The stop's one line in the log; the exit code (128 + the signal)."""
    print(f"ampkit bench worker: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ampkit.bench.worker JOB.json", file=sys.stderr)
        return 2
    for signum in STOP_SIGNALS:  # a stop is one line in the log, not a traceback
        signal.signal(signum, _stop)
    if _EARLY_STOP:  # it came while this process imported torch (see `_EARLY_STOP`)
        return _stopped(_EARLY_STOP[0])
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    env = launch_env()  # torchrun's ranks (bench --parallel), else None: one process
    try:
        result = run_job(job, ProgressEmitter.for_rank(env.rank if env else 0))
    except WorkerStopped as stop:  # partial files are already removed (`runs.atomic_write`)
        return _stopped(stop.signum)
    except Exception as err:
        traceback.print_exc(file=sys.stderr)  # the full story goes to the worker's log file
        return write_failure(job, rank_error(err, rank=env.rank) if env else err, first_only=env is not None)
    return 0 if result["status"] == "ok" else 1


def write_failure(job: dict[str, Any], err: BaseException, *, first_only: bool) -> int:
    """The failed result, in one line; `first_only` (ranks): unless a rank already wrote one, as the
    rank that failed first did before its peers lost contact with it. Returns the exit code (1)."""
    kind, message = describe_failure(err)
    result = {"precision": job["precision"], "status": "failed", "error": message, "error_kind": kind}
    if first_only and Path(job["result_path"]).exists():
        return 1
    try:
        write_json_atomic(job["result_path"], result)
    except WriteFailed as failed:  # the parent finds no result and reports this line from the log
        print(f"ampkit bench worker: {failed}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    end_process(main())
