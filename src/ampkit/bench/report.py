"""The bench report: report.html (self-contained, plots embedded) and report.md, from a bench summary.

Works from summary.json alone, so `ampkit report RUN_DIR` re-renders any bench run.
"""

from __future__ import annotations

from pathlib import Path

from ampkit.bench.budget_text import budget_lines
from ampkit.bench.figures import fidelity_figure, loss_figure, profile_figure, step_time_figure, throughput_figure
from ampkit.bench.render import (
    _memory_note,
    _ok,
    _profiled,
    _speedup_note,
    _title,
    _unit,
    _with_fidelity,
    fidelity_rows,
    main_rows,
    memory_rows,
    profile_rows,
    recommendation_text,
    setup_text,
    train_text,
    why_lines,
)
from ampkit.report import Report, as_stored


def build_report(summary: dict) -> Report:
    report = Report(title=_title(summary), provenance=summary.get("provenance"))
    report.text(recommendation_text(summary), kind="note")
    for line in summary["recommendation"]["advice"] + summary["warnings"]:
        report.text(line, kind="warn")
    for e in summary["precisions"]:
        if e["status"] == "failed":
            report.text(f"{e['name']} failed: {e['error']}", kind="warn")
    report.heading("Setup")
    for line in setup_text(summary) + budget_lines(summary):
        report.text(line)
    train = train_text(summary)
    if train:
        report.text(train, kind="note")
    report.heading("Side by side")
    report.table(*main_rows(summary))
    if summary.get("loss_common_step"):
        report.text(
            f"The loss column is each precision's training loss at step {summary['loss_common_step']}, the last step "
            "every precision measured on fp32's batches reached (same batch, same initial weights); the loss-curve "
            "gap in the fidelity table compares every step."
        )
    if _ok(summary):
        report.figure(
            throughput_figure(summary), f"{_unit(summary)}/s and peak memory per precision ({_ratio_labels(summary)})"
        )
        _fidelity_section(report, summary)
        _why_section(report, summary)
        report.heading("Loss curves")
        report.figure(loss_figure(summary), "training loss per step")
        report.heading("Step time")
        report.figure(step_time_figure(summary), "distribution of measured step times")
        _memory_section(report, summary)
    return report


def _ratio_labels(summary: dict) -> str:
    marked = any(_speedup_note(e, summary) for e in _ok(summary))
    return "labels: ratio to fp32" + ("; *: over the steps both ran, as the table's status says" if marked else "")


def _fidelity_section(report: Report, summary: dict) -> None:
    report.heading("Fidelity against fp32")
    report.text(
        "Same initial weights, same fixed held-out batch: cosine similarity of the logits "
        "(>= 0.99 healthy, < 0.9 a layer's error is being amplified), their max absolute difference, "
        "the loss difference, the cosine of the whole gradient vector, and the gap between the loss "
        "curves over the steps both precisions ran."
    )
    report.table(*fidelity_rows(summary))
    if any(e["name"] != summary["reference"] for e in _with_fidelity(summary)):
        report.figure(fidelity_figure(summary), "1 - cosine similarity vs fp32 (log scale)")


def _why_section(report: Report, summary: dict) -> None:
    if not _profiled(summary):
        return
    report.heading("Why it is faster, or not")
    report.text(
        "One training step per precision under torch.profiler (the last untimed warmup step), its time by "
        "category: matmul/attention, normalisation modules, elementwise ops and reductions, dtype casts, the "
        "optimizer phase (unscale, clipping, step), the batch fetch, and the rest (layout, allocation, the "
        "autograd engine, Python)."
    )
    for line in why_lines(summary):
        report.text(line)
    report.table(*profile_rows(summary))
    report.figure(profile_figure(summary), "profiled step time by category")


def _memory_section(report: Report, summary: dict) -> None:
    report.heading("Memory")
    report.text(_memory_note(summary))
    how = (
        "the caching allocator's max_memory_allocated over the step"
        if summary["device"]["type"] != "cpu"
        else "what was held when it began plus the running sum of torch.profiler's allocation events"
    )
    report.text(
        f"Step peak: the profiled step's peak as the allocator saw it ({how}), beside the memory planner's "
        "prediction of the same step's tensor peak (`ampkit plan`: the analytic ledger for a language model, one "
        "step traced on fake tensors for any other task)."
    )
    report.table(*memory_rows(summary))


def render_report(summary: dict, run_dir: str | Path) -> tuple[Path, Path]:
    """Write report.html (self-contained, plots embedded) and report.md into run_dir."""
    return build_report(as_stored(summary)).write(run_dir)  # as `ampkit report` reads it back
