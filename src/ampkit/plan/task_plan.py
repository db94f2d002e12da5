"""`ampkit plan --task ...`: the memory ledger of any task's training step, traced on fake tensors.

The analytic ledger replays transformer shapes op by op, so it exists for the language model only; a
task's model is instead run for real, one steady-state training step of `ampkit.core.Trainer`, on
fake tensors (no storage: the model's size does not matter) with the storage tracker filing every
allocation under a ledger line. The largest micro-batch that fits comes from two traces: a step's
memory is affine in the micro-batch (weights, gradients and optimizer states fixed; activations
linear), so totals at b and 2b give the slope. Units: bytes; GiB in text (1024**3).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ampkit.errors import UsageError
from ampkit.plan.fit import Target, resolve_target
from ampkit.plan.planner import ledger_kwargs
from ampkit.plan.setting import GIB, Reserve, StepSetting
from ampkit.plan.traced.trace import (
    _train_step,
    checkpoint_task_blocks,
    convert_for_trace,
    steady_state_optimizer,
    tracker_ledger,
)
from ampkit.plan.traced.tracker import StorageTracker
from ampkit.precision import build_precision, get_spec
from ampkit.tasks import optional
from ampkit.tasks.base import Task
from ampkit.tasks.check import one_line
from ampkit.tasks.flops import flop_counter

TASK_PLAN_SCHEMA = "ampkit.plan-task/1"


def trace_task_step(task: Task, setting: StepSetting, *, batch: Any) -> tuple[StorageTracker, float | None]:
    """One steady-state training step of `task` on fake tensors: (the tracker, FLOPs per item)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not traceable(setting.precision):
        raise UsageError("cannot trace native fp8 on CPU; plan fp8-emulated, which traces the same recipe")
    policy = build_precision(setting.precision, device_type="cpu")
    tracker = StorageTracker()
    fake = FakeTensorMode(allow_non_fake_inputs=True)  # bitsandbytes' lookup tables stay real constants
    with fake, policy.init_context():
        model = convert_for_trace(policy, task.build_model(device=torch.device("cpu"), seed=0))
    optimizer = steady_state_optimizer(model, setting, tracker, fake)
    with fake:
        if setting.checkpointing == "full":
            checkpoint_task_blocks(optional.repeated_blocks(task, model), tracker)
        fake_batch = optional.map_tensors(batch, fake.from_tensor)
        for tensor in optional.tensors_of(fake_batch):
            tracker.tag(tensor, "activations")
        with policy.run_context(), tracker:
            _train_step(model, policy, optimizer, tracker, fake_batch, loss_fn=task.loss, count_fn=task.count)
        with flop_counter() as counter:
            # the inputs as the step converts them (a -true regime's dtype)
            loss, _ = task.loss(model, policy.convert_input(fake_batch))
            loss.backward()
    _, slots = task.count(batch)
    return tracker, (counter.get_total_flops() / slots if slots else None)


def task_ledger(task: Task, setting: StepSetting, *, batch: Any, reserve: Reserve):
    trace = lambda: trace_task_step(task, setting, batch=batch)  # noqa: E731 - the user's model and loss run inside
    tracker, flops = one_line(task, "step failed when traced on fake tensors", trace)
    ledger = tracker_ledger(tracker, setting, reserve)
    return dataclasses.replace(ledger, peak_moment=ledger.peak_moment or "step"), flops


def _largest_batch(b: int, total_b: int, total_2b: int, capacity: int) -> int | None:
    """The largest micro-batch whose step fits `capacity`, from totals at b and 2b (affine in b)."""
    slope = (total_2b - total_b) / b
    if slope <= 0:
        return None
    return max(0, int(b + (capacity - total_b) // slope))


def _row(task: Task, setting: StepSetting, config, target: Target | None) -> dict[str, Any]:
    kwargs = ledger_kwargs(config)
    b = setting.micro_batch
    stream = task.train_stream(batch_size=b, seed=0)
    ledger, flops = task_ledger(task, setting, batch=stream.next_batch(), **kwargs)
    row: dict[str, Any] = {"setting": setting.to_dict(), "traced": ledger.to_dict(), "flops_per_item": flops}
    if target is not None:
        double = task.train_stream(batch_size=2 * b, seed=0).next_batch()
        twice, _ = task_ledger(task, StepSetting(**{**setting.to_dict(), "micro_batch": 2 * b}), batch=double, **kwargs)
        row["fit"] = {
            "fits": ledger.total <= target.capacity_bytes,
            "headroom_bytes": target.capacity_bytes - ledger.total,
            "max_micro_batch": _largest_batch(b, ledger.total, twice.total, target.capacity_bytes),
        }
        peak = target.gpu.peak_flops(get_spec(setting.precision).matmul_key) if target.gpu else None
        items = b * setting.grad_accum
        row["compute"] = {
            "flops_per_step": flops * items if flops else None,
            "step_s_at_peak": flops * items / peak if flops and peak else None,
        }
    return row


def build_task_plan(config, task: Task) -> dict[str, Any]:
    """The plan of every precision x optimizer x checkpointing setting for `task` (traced only)."""
    from ampkit.plan.planner import settings_of

    target = resolve_target(config.gpu, config.gpu_mem)
    settings = [s for s in settings_of(config) if traceable(s.precision)]
    if not _has_blocks(task):  # checkpointing recomputes repeated blocks: nothing to recompute
        settings = [s for s in settings if s.checkpointing == "none"]
    return {
        "schema": TASK_PLAN_SCHEMA,
        "command": "plan",
        "units": {"memory": "bytes; fields ending in _gib are GiB (1024**3 bytes)", "flops": "FLOPs"},
        "config": dataclasses.asdict(config),
        "task": optional.describe(task),
        "engine": "traced",
        "analytic_note": "the analytic ledger replays transformer shapes only; this task is planned by tracing "
        "one training step of its own model on fake tensors",
        "target": target.to_dict() if target else None,
        "rows": [_row(task, s, config, target) for s in settings],
        "skipped": sorted({s.precision for s in settings_of(config) if not traceable(s.precision)}),
    }


def _has_blocks(task: Task) -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        return bool(optional.repeated_blocks(task, task.build_model(device=torch.device("cpu"), seed=0)))


def traceable(precision: str) -> bool:
    """Native fp8 needs an sm89+ GPU's kernels; fp8-emulated traces the same recipe on CPU."""
    spec = get_spec(precision)
    return not spec.native_low_bit


TABLE_HEADERS = ["precision / optimizer", "ckpt", "params", "grads", "states", "activ", "temps", "total GiB", "fits"]


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.3f}"


def task_plan_rows(summary: dict[str, Any]) -> list[list[str]]:
    rows = []
    for row in summary["rows"]:
        s, lines = row["setting"], row["traced"]["lines_at_peak_bytes"]
        fit = row.get("fit")
        rows.append(
            [
                f"{s['precision']} / {s['optimizer']}",
                s["checkpointing"],
                *(
                    _gib(lines[k])
                    for k in ("parameters", "gradients", "optimizer_states", "activations", "temporaries")
                ),
                _gib(row["traced"]["total_bytes"]),
                "-" if fit is None else ("yes" if fit["fits"] else "no") + f" (max batch {fit['max_micro_batch']})",
            ]
        )
    return rows


def task_plan_table(summary: dict[str, Any], *, wide: bool = False):
    """One row per setting. `wide`: the report's columns; else the setting in one cell (the optimizer in the
    title when there is one), activations and temporaries as one "activ" column, "fits" and "max batch" apart."""
    from ampkit.plan.render.report import titled
    from ampkit.report.console import columns, compact_table

    task, target, rows = summary["task"], summary["target"], summary["rows"]
    where = f" · {target['name']}" if target else ""
    batch = summary["config"].get("batch_size", summary["config"].get("micro_batch"))  # micro_batch: before the rename
    head = f"ampkit plan · {task['name']} (traced){where} · micro-batch {batch}"
    title, one = titled(head, rows, wide=wide, sep=" · ", tail=" · GiB")
    if wide:
        return compact_table(title, columns(TABLE_HEADERS, names=2), task_plan_rows(summary))
    headers = ["setting", "params", "grads", "optim", "activ", "total", "fits", "max batch"]
    cells = []
    for row in rows:
        s, lines, fit = row["setting"], row["traced"]["lines_at_peak_bytes"], row.get("fit")
        setting = s["precision"] + ("" if one else f"/{s['optimizer']}")
        cells.append(
            [
                setting + ("/ckpt" if s["checkpointing"] != "none" else ""),
                *(_gib(lines[k]) for k in ("parameters", "gradients", "optimizer_states")),
                _gib(lines["activations"] + lines["temporaries"]),
                _gib(row["traced"]["total_bytes"]),
                "-" if fit is None else ("yes" if fit["fits"] else "no"),
                "-" if fit is None else f"{fit['max_micro_batch']:,}",
            ]
        )
    return compact_table(title, columns(headers), cells, notes=["activ: activations + temporaries"])


def write_task_plan_report(summary: dict[str, Any], run_dir) -> tuple:
    from ampkit.report import Report, as_stored

    summary = as_stored(summary)  # the values `ampkit report` reads back: the same page, byte for byte
    report = Report(title=f"ampkit plan: {summary['task']['name']} (traced)", provenance=summary.get("provenance"))
    report.text(
        summary["analytic_note"] + ". Memory in GiB (1024^3 bytes): each line is what is alive when the "
        "step's tensor memory peaks, plus the framework reserve (CUDA context + fragmentation).",
        kind="note",
    )
    report.table(TABLE_HEADERS, task_plan_rows(summary))
    if summary["skipped"]:
        report.text(f"Not traced: {', '.join(summary['skipped'])} (native fp8 runs on sm89+ GPUs only).")
    return report.write(run_dir)
