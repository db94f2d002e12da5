"""One precision, measured in its own fresh process: `python -m ampkit.bench.worker JOB.json`.

A fresh process per precision means its peak memory is its own and no state (allocator caches,
autocast caches, TF32 flags, oneDNN primitives) leaks from one precision into the next.

Order of work (the parent relies on it):
    build (device check -> data -> model -> policy -> optimizer; same seed = same weights and batches)
    -> fidelity capture at the initial weights on a fixed held-out batch (written to a .pt file)
    -> `warmup_steps` untimed steps -> measured steps until the budget (min/max steps apply)
    -> peak memory reading -> the MFU denominator (peak FLOP/s of this precision's compute dtype).
Progress goes to stdout as JSON lines (the parent draws the bars); the result goes to the job's
`result_path` as JSON, also when the run fails (status "failed" and a one-line error).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from ampkit.bench.config import BenchConfig
from ampkit.bench.fidelity import capture_fidelity, fixed_batch
from ampkit.bench.timing import make_step_timer, synchronize
from ampkit.config import resolve_config
from ampkit.errors import TrainingError, UsageError, WriteFailed
from ampkit.hardware import matmul_size_for, measure_matmul_flops, measured_peak_flops, peak_flops
from ampkit.memory import peak_memory_bytes, reset_peak_memory
from ampkit.precision import get_spec
from ampkit.runs import atomic_write, write_json_atomic
from ampkit.tasks import optional
from ampkit.tasks.flops import flops_per_item
from ampkit.train import TrainConfig, build_run
from ampkit.train.features import Features

LR_WARMUP_STEPS = 10  # the LR schedule's warmup; the same in every precision (not the timing warmup)
PROGRESS_EVERY_S = 0.25  # at most ~4 progress lines a second on stdout


class ProgressEmitter:
    """JSON lines on stdout for the parent's progress bar; step lines are rate-limited."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self._last = 0.0

    def emit(self, event: str, *, force: bool = True, **fields: Any) -> None:
        now = time.perf_counter()
        if not force and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        self.stream.write(json.dumps({"event": event, **fields}) + "\n")
        self.stream.flush()


def train_config_for(config: BenchConfig, precision: str) -> TrainConfig:
    """The training run a bench worker performs: the same for every precision but the precision."""
    _, max_steps = config.measured_steps_range
    return TrainConfig(
        precision=precision,
        task=config.task,
        task_args=config.task_args,
        model=config.model,
        data=config.data,
        device=config.device,
        steps=config.warmup_steps + max_steps,  # the LR schedule spans the longest possible run
        batch_size=config.batch_size,
        seq_len=config.seq_len,
        lr=config.lr,
        warmup_steps=LR_WARMUP_STEPS,
        seed=config.seed,
        eval_batches=1,
        fit_check=False,  # the parent checked every precision before any worker started
        lora=config.lora,  # --lora: the base stored as this precision implies, fp32 adapters
    )


def load_pickled_task(path: str | None, main_path: str | None = None):
    """The task object the Python API pickled for the workers (`ampkit.bench.run(task)`), or None.

    Classes and functions of the parent's own script pickle as `__main__.NAME`: as multiprocessing's
    spawn does, the script is imported first as `__mp_main__` and stands in for `__main__` (its
    `if __name__ == "__main__":` block does not run)."""
    if path is None:
        return None
    if main_path:
        _import_main_script(main_path)
    with open(path, "rb") as fh:
        return pickle.load(fh)  # noqa: S301 - written by this bench's parent process, in its own run directory


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


def measure_steps(objs, config: BenchConfig, emit: ProgressEmitter) -> dict[str, Any]:
    """Untimed warmup, then timed steps until the budget is spent (min/max steps apply)."""
    trainer, device = objs.trainer, objs.device
    results = []
    emit.emit("phase", phase="warmup")
    for _ in range(config.warmup_steps):
        results.append(trainer.train_step())
    synchronize(device)  # the measured window starts with an idle device
    timer = make_step_timer(device)
    lo, hi = config.measured_steps_range
    budget_s = math.inf if config.steps else config.budget_s
    start = time.perf_counter()
    measured = tokens = 0
    emit.emit("phase", phase="measure")
    while measured < hi and (measured < lo or time.perf_counter() - start < budget_s):
        timer.start()
        results.append(trainer.train_step())
        timer.stop()
        measured += 1
        tokens += results[-1].n_tokens
        emit.emit("step", force=measured == hi, measured=measured, tokens=tokens, elapsed_s=time.perf_counter() - start)
    step_s = timer.seconds()
    measured_results = results[config.warmup_steps :]
    losses = torch.stack([r.loss.float() for r in results]).cpu().tolist()  # one sync for the whole run
    grad_norms = torch.stack([r.grad_norm.float() for r in results]).cpu().tolist()
    return {
        "warmup_steps": config.warmup_steps,
        "measured_steps": measured,
        "step_s": step_s,
        "tokens": [r.n_tokens for r in measured_results],
        "slots": [r.n_slots for r in measured_results],
        "loss_curve": losses,
        "skipped_steps": sum(not r.stepped for r in results),
        "nonfinite_loss_steps": sum(not math.isfinite(v) for v in losses),
        "nonfinite_grad_steps": sum(not math.isfinite(v) for v in grad_norms),
        "final_loss_scale": objs.policy.loss_scale(),
    }


def memory_reading(device: torch.device, rss_before: int) -> dict[str, Any]:
    """Peak memory of this process's run. CPU: peak RSS (interpreter and torch included) and its
    growth over the RSS before the model was built. CUDA: the caching allocator's maxima."""
    peak = peak_memory_bytes(device)
    if device.type == "cuda":
        return {
            "kind": "cuda",
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


def peak_flops_for(precision: str, device: torch.device, info) -> dict[str, Any]:
    """The MFU denominator: the GPU table's dense peak for this precision's compute dtype, else
    (CPU, unknown GPU) a matmul measured here in that dtype."""
    spec = get_spec(precision)
    key = spec.matmul_key
    if info.type == "cuda":
        table = peak_flops(info, key)
        if table:
            return {"peak_flops": table, "source": "gpu-table", "dtype": key}
    if key == "tf32":
        measured = measure_matmul_flops(
            torch.float32, device=device, size=matmul_size_for(info, "tf32"), allow_tf32=True
        )
    elif key == "fp8":  # no fp8 matmul probe here: an unknown fp8 GPU gets no MFU
        return {"peak_flops": None, "source": "unknown", "dtype": key}
    else:
        measured = measured_peak_flops(device, spec.compute_dtype)
    return {"peak_flops": measured, "source": "measured-matmul", "dtype": key}


def run_job(job: dict[str, Any], emit: ProgressEmitter) -> dict[str, Any]:
    config = resolve_config(BenchConfig, base=job["config"], base_source="the bench job")  # sections too ([lora])
    precision = job["precision"]
    rss_before = current_rss_bytes()
    emit.emit("phase", phase="build")
    train_config = train_config_for(config, precision)
    if job.get("features"):  # `bench --sweep`: one combination of throughput switches
        train_config = dataclasses.replace(train_config, features=Features(**job["features"]))
    objs = build_run(train_config, task=load_pickled_task(job.get("task_pickle"), job.get("main_path")))
    reset_peak_memory(objs.device)
    with objs.policy.run_context():
        emit.emit("phase", phase="fidelity")
        batch = fixed_batch(objs.val_batches).to(objs.device)
        capture = capture_fidelity(model=objs.model, policy=objs.policy, batch=batch, task=objs.task)
        with atomic_write(job["fidelity_path"]) as fh:  # a failure to write: WriteFailed, no partial file
            torch.save(capture, fh)
        flops = flops_per_item(objs.task, objs.model, batch, batch_size=config.batch_size)  # after: no weight moved
        steps = measure_steps(objs, config, emit)
    memory = memory_reading(objs.device, rss_before)  # before the peak matmul: its buffers are not the run's
    emit.emit("phase", phase="peak")
    peak = peak_flops_for(precision, objs.device, objs.device_info)
    return {
        "precision": precision,
        "status": "ok",
        "error": None,
        "threads": torch.get_num_threads(),
        "fidelity_path": job["fidelity_path"],
        **steps,
        "memory": memory,
        "peak": peak,
        **flops.to_dict(),
        "unit": objs.task.unit,
        "parameters": sum(p.numel() for p in objs.model.parameters()),  # distinct elements (ties once)
        "task": optional.describe(objs.task),
        "throughput": objs.features_summary(),
    }


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ampkit.bench.worker JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        result = run_job(job, ProgressEmitter())
    except Exception as err:  # noqa: BLE001 - every failure becomes a one-line result for the parent
        traceback.print_exc(file=sys.stderr)  # the full story goes to the worker's log file
        kind, message = describe_failure(err)
        result = {"precision": job["precision"], "status": "failed", "error": message, "error_kind": kind}
    try:
        write_json_atomic(job["result_path"], result)
    except WriteFailed as err:  # the parent finds no result and reports this line from the log
        print(f"ampkit bench worker: {err}", file=sys.stderr)
        return 1
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
