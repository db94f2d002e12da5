"""`ampkit plan --lora RANK [--base-dtype nf4]`: the LoRA ledger per precision x optimizer x checkpointing,
its fit and largest micro-batch on a named GPU, and full fine-tuning vs LoRA vs QLoRA side by side.

Rows: the analytic LoRA ledger (`ampkit.plan.lora.ledger`), and with `--trace` the traced one and their
agreement. The comparison ("methods"): at the plan's micro-batch and sequence, under the GPU's
precision (bf16-mixed, or fp16-mixed where bf16 is not native): full fine-tuning (the full ledger,
AdamW over every weight), LoRA (the base in that precision's compute dtype) and QLoRA (an nf4 base), each
with its total, whether it fits and its largest micro-batch. Compute (FLOPs, step time) is not planned
for LoRA: its backward skips the base's weight gradients (about 4N FLOPs per token instead of 6N).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from rich.console import Group

from ampkit.errors import UsageError
from ampkit.plan.advice import base_precision
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import ModelDescription
from ampkit.plan.fit import Target, largest, resolve_target
from ampkit.plan.lora.ledger import (
    LoraPlan,
    adapter_tensors,
    analytic_lora_ledger,
    check_lora_plannable,
    lora_dims,
    lora_largest,
)
from ampkit.plan.planner import UNITS, agreement, ledger_kwargs
from ampkit.plan.setting import GIB, Ledger, StepSetting
from ampkit.report.console import columns, compact_table

LORA_PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")
"""What the LoRA ledger plans (the base dtype is --base-dtype; *-true and fp8 are not planned with --lora)."""
PRECISION_TOLERANCE = 0.01
"""analytic vs traced, on the tensor peak, for the LoRA ledger"""


def lora_precisions(config: PlanConfig) -> list[str]:
    names = config.precision_list()
    if config.precisions.strip().lower() == "all":
        return [n for n in names if n in LORA_PRECISIONS]
    bad = [n for n in names if n not in LORA_PRECISIONS]
    if bad:
        raise UsageError(
            f"plan --lora plans {', '.join(LORA_PRECISIONS)} (the base's dtype is --base-dtype), not {bad[0]}"
        )
    return names


def _setting(config: PlanConfig, precision: str, optimizer: str, checkpointing: str) -> StepSetting:
    return StepSetting(
        precision=precision,
        optimizer=optimizer,
        checkpointing=checkpointing,
        micro_batch=config.batch_size,
        seq_len=config.seq_len,
        grad_accum=config.grad_accum,
    )


def _fit(desc, setting, plan, ledger: Ledger, target: Target | None, kwargs) -> dict[str, Any] | None:
    if target is None:
        return None
    best = lora_largest(desc, setting, plan, target.capacity_bytes, **kwargs)
    return {
        "fits": ledger.total <= target.capacity_bytes,
        "headroom_gib": round((target.capacity_bytes - ledger.total) / GIB, 3),
        "max_micro_batch": best,
    }


def lora_row(desc, setting: StepSetting, config: PlanConfig, target: Target | None) -> dict[str, Any]:
    kwargs = ledger_kwargs(config)
    plan = LoraPlan(settings=config.lora, precision=setting.precision)
    ledger = analytic_lora_ledger(desc, setting, plan, **kwargs)
    row: dict[str, Any] = {
        "setting": setting.to_dict(),
        "lora": plan.describe(),
        "analytic": ledger.to_dict(),
        "traced": None,
        "agreement": None,
        "fit": _fit(desc, setting, plan, ledger, target, kwargs),
    }
    if config.trace:
        from ampkit.plan.lora.trace import traced_lora_ledger

        traced = traced_lora_ledger(desc, setting, plan, **kwargs)
        agree = agreement(ledger, traced)
        agree["within_lora_tolerance"] = abs(agree["tensor_peak_relative"]) <= PRECISION_TOLERANCE
        row.update(traced=traced.to_dict(), agreement=agree)
    return row


def trainable_parameters(desc: ModelDescription, config: PlanConfig) -> dict[str, Any]:
    """The adapters' parameter elements beside all of the model's, peft's way (`print_trainable_parameters`:
    the frozen base counted whole, a 4-bit weight by its unpacked elements; the same for every setting)."""
    plan = LoraPlan(settings=config.lora, precision="fp32")  # the counts do not depend on the precision
    dims = lora_dims(desc, StepSetting(precision="fp32", micro_batch=1, seq_len=1), plan)  # widths and rank only
    trainable = sum(adapter_tensors(desc, dims, plan))
    total = desc.num_parameters() + trainable
    return {
        "trainable_parameters": trainable,
        "total_parameters": total,
        "trainable_percent": 100.0 * trainable / total,
    }


def trainable_line(summary: dict[str, Any]) -> str | None:
    """peft's own line ("trainable params: 4,194,304 || all params: 6,742,609,920 || trainable%: 0.0622"),
    or None for a summary written before it was counted."""
    counts = summary.get("trainable")
    if not counts:
        return None
    return (
        f"trainable params: {counts['trainable_parameters']:,} || all params: {counts['total_parameters']:,} || "
        f"trainable%: {counts['trainable_percent']:.4f}"
    )


NARROWEST = 80
"""console columns a note line is kept within (a wider terminal shows it the same)"""


def trainable_notes(summary: dict[str, Any]) -> list[str]:
    """peft's line under the LoRA ledger; one too long for 80 columns (a 70B model's) broken before
    `trainable%` rather than wherever the terminal wraps it."""
    line = trainable_line(summary)
    if line is None:
        return []
    if len(line) <= NARROWEST:
        return [line]
    head, share = line.rsplit(" || ", 1)
    return [f"{head} ||", share]


def methods(desc: ModelDescription, config: PlanConfig, target: Target | None) -> dict[str, Any]:
    """Full fine-tuning vs LoRA vs QLoRA at the plan's shape, under the GPU's precision."""
    precision, reason = base_precision(target.gpu if target else None)
    kwargs = ledger_kwargs(config)
    setting = _setting(config, precision, config.optimizer_list()[0], "none")
    full = analytic_ledger(desc, setting, **kwargs)
    out = [_method("full fine-tuning", full, None, setting, desc, target, kwargs)]
    for label, base in (("LoRA", "auto"), ("QLoRA (nf4)", "nf4")):
        settings = dataclasses.replace(config.lora, base_dtype=base)
        plan = LoraPlan(settings=settings, precision=precision)
        ledger = analytic_lora_ledger(desc, setting, plan, **kwargs)
        out.append(_method(label, ledger, plan, setting, desc, target, kwargs))
    return {"precision": precision, "reason": reason, "setting": setting.to_dict(), "methods": out}


def _method(label, ledger: Ledger, plan, setting, desc, target, kwargs) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "method": label,
        "base_dtype": plan.base_dtype if plan else setting.precision,
        "total_gib": round(ledger.total / GIB, 3),
        "lines_at_peak_bytes": ledger.lines(),
        "fits": None,
        "max_micro_batch": None,
    }
    if target is not None:
        entry["fits"] = ledger.total <= target.capacity_bytes
        if plan is None:
            entry["max_micro_batch"] = largest(desc, setting, target.capacity_bytes, field="micro_batch", **kwargs)
        else:
            entry["max_micro_batch"] = lora_largest(desc, setting, plan, target.capacity_bytes, **kwargs)
    return entry


def build_lora_plan(config: PlanConfig, *, desc: ModelDescription) -> dict[str, Any]:
    """plan's summary.json for `--lora` (schema "ampkit.plan-lora/1", with a "lora" section and LoRA rows)."""
    check_lora_plannable(desc, LoraPlan(settings=config.lora, precision="bf16-mixed"))
    config = config.for_model(desc.max_positions)  # --seq-len 0: 2048, or the model's positions when fewer
    if config.parallel != "none":
        raise UsageError("plan --lora plans one process (LoRA runs are not sharded); drop --parallel")
    target = resolve_target(config.gpu, config.gpu_mem)
    combos = itertools.product(lora_precisions(config), config.optimizer_list(), config.checkpointing_list())
    rows = [lora_row(desc, _setting(config, p, o, c), config, target) for p, o, c in combos]
    return {
        "schema": "ampkit.plan-lora/1",  # its own kind (ampkit.summaries.PLAN_LORA); before it: plan's id
        "units": UNITS,
        "config": dataclasses.asdict(config),
        "model": desc.to_dict(),
        "target": target.to_dict() if target else None,
        "lora": dataclasses.asdict(config.lora),
        "trainable": trainable_parameters(desc, config),
        "rows": rows,
        "methods": methods(desc, config, target),
        "notes": [
            "compute is not planned for LoRA: its backward skips the base's weight gradients (~4N FLOPs per token, "
            "not 6N)"
        ],
    }


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


LORA_LINES = ("parameters", "gradients", "optimizer_states", "weight_copies", "activations", "temporaries")


def lora_rows_table(summary: dict[str, Any], *, wide: bool = False) -> Group:
    """The LoRA ledger per setting. `wide`: every line; else weights (parameters + copies), grads, optim and
    activ (activations + temporaries), the total, the traced agreement (with --trace) and the largest micro-batch."""
    lora, rows = summary["lora"], summary["rows"]
    s0 = rows[0]["setting"] if rows else {"micro_batch": 0, "seq_len": 0}
    shape = f"mb {s0['micro_batch']} x {s0['seq_len']}"
    title = f"LoRA rank {lora['lora']} ledger · {summary['model']['name']} · {shape} (GiB, at the peak)"
    traced = any(r["agreement"] for r in rows)
    if wide:
        headers = ["setting", "base", "params", "grads", "optim", "copies", "activ.", "temps", "total"]
        groups: list[tuple[str, ...]] = [(k,) for k in LORA_LINES]
    else:
        headers = ["setting", "base", "weights", "grads", "optim", "activ", "total"]
        groups = [
            ("parameters", "weight_copies"),
            ("gradients",),
            ("optimizer_states",),
            ("activations", "temporaries"),
        ]
    headers += ["vs traced"] if traced or wide else []
    headers.append("max mb")
    cells = []
    for row in rows:
        s, lines = row["setting"], row["analytic"]["lines_at_peak_bytes"]
        ckpt = "/ckpt" if s["checkpointing"] == "full" else ""
        agree = row["agreement"]
        cells.append(
            [
                f"{s['precision']}/{s['optimizer']}{ckpt}",
                row["lora"]["base_dtype"],
                *(_gib(sum(lines[k] for k in keys)) for keys in groups),
                f"{row['analytic']['total_gib']:.2f}",
                *([f"{100 * agree['tensor_peak_relative']:+.2f}%" if agree else "-"] if traced or wide else []),
                str(row["fit"]["max_micro_batch"]) if row["fit"] else "-",
            ]
        )
    return compact_table(title, columns(headers, names=2), cells, notes=trainable_notes(summary))


def methods_table(summary: dict[str, Any], *, wide: bool = False) -> Group:
    """Full fine-tuning vs LoRA vs QLoRA (`wide`: activations, temporaries and weight copies as "work")."""
    info, target = summary["methods"], summary["target"]
    where = f" on {target['name']}" if target else ""
    s = info["setting"]
    shape = f"mb {s['micro_batch']} x {s['seq_len']}"
    title = f"full fine-tuning vs LoRA vs QLoRA{where} · {info['precision']} · {shape} · GiB"
    headers = ["method", "base", "params", "grads", "optim", "work", "total", "fits", "max mb"]
    cells = []
    for m in info["methods"]:
        lines = m["lines_at_peak_bytes"]
        work = lines["activations"] + lines["temporaries"] + lines["weight_copies"]
        cells.append(
            [
                m["method"],
                m["base_dtype"],
                _gib(lines["parameters"]),
                _gib(lines["gradients"]),
                _gib(lines["optimizer_states"]),
                _gib(work),
                f"{m['total_gib']:.2f}",
                "-" if m["fits"] is None else ("yes" if m["fits"] else "no"),
                "-" if m["max_micro_batch"] is None else str(m["max_micro_batch"]),
            ]
        )
    notes = ["work: activations + temporaries + low-precision weight copies"]
    return compact_table(title, columns(headers, names=2), cells, notes=notes)


LORA_HEADERS = [
    "setting",
    "base",
    "params",
    "grads",
    "optim",
    "copies",
    "activ.",
    "temps",
    "total",
    "vs traced",
    "max mb",
]
METHOD_HEADERS = ["method", "base", "params", "grads", "optim", "activ.+temps", "total GiB", "fits", "max mb"]


def lora_report_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The LoRA ledger per setting (GiB at the peak), as the report's table shows it."""
    out = []
    for row in summary["rows"]:
        s, lines, agree = row["setting"], row["analytic"]["lines_at_peak_bytes"], row["agreement"]
        keys = ("parameters", "gradients", "optimizer_states", "weight_copies", "activations", "temporaries")
        out.append(
            [
                f"{s['precision']}/{s['optimizer']}{'/ckpt' if s['checkpointing'] == 'full' else ''}",
                row["lora"]["base_dtype"],
                *(_gib(lines[k]) for k in keys),
                f"{row['analytic']['total_gib']:.2f}",
                f"{100 * agree['tensor_peak_relative']:+.2f}%" if agree else "-",
                str(row["fit"]["max_micro_batch"]) if row["fit"] else "-",
            ]
        )
    return out


def method_report_rows(summary: dict[str, Any]) -> list[list[str]]:
    """Full fine-tuning vs LoRA vs QLoRA at one setting (GiB at the peak)."""
    out = []
    for m in summary["methods"]["methods"]:
        lines = m["lines_at_peak_bytes"]
        work = lines["activations"] + lines["temporaries"] + lines["weight_copies"]
        out.append(
            [
                m["method"],
                m["base_dtype"],
                *(_gib(lines[k]) for k in ("parameters", "gradients", "optimizer_states")),
                _gib(work),
                f"{m['total_gib']:.2f}",
                "-" if m["fits"] is None else ("yes" if m["fits"] else "no"),
                "-" if m["max_micro_batch"] is None else str(m["max_micro_batch"]),
            ]
        )
    return out


def write_lora_plan_report(summary: dict[str, Any], run_dir) -> tuple:
    """`plan --lora`'s report.html and report.md, from summary.json alone."""
    from ampkit.report import Report, as_stored

    summary = as_stored(summary)  # the values `ampkit report` reads back: the same page, byte for byte
    lora, target, info = summary["lora"], summary["target"], summary["methods"]
    title = f"ampkit plan --lora {lora['lora']}: {summary['model']['name']}"
    report = Report(title=title, provenance=summary.get("provenance"))
    report.text(
        "Memory in GiB (1024^3 bytes): each line is what is alive when the step's tensor memory peaks.", kind="note"
    )
    report.heading("LoRA ledger")
    if trainable_line(summary):
        report.text(f"{trainable_line(summary)} (the adapters; peft's count)")
    report.table(LORA_HEADERS, lora_report_rows(summary))
    where = f" on {target['name']}" if target else ""
    s = info["setting"]
    report.heading(f"Full fine-tuning vs LoRA vs QLoRA{where}")
    report.text(f"{info['precision']}, micro-batch {s['micro_batch']} x {s['seq_len']} tokens.")
    report.table(METHOD_HEADERS, method_report_rows(summary))
    for note in summary["notes"]:
        report.text(note)
    return report.write(run_dir)
