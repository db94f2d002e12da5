"""The report of a callback's run ("ampkit.callback/1"): report.html and report.md from summary.json
and metrics.jsonl alone, written when training ends and again by `ampkit report RUN_DIR`.

Its sections are the ones train's and doctor's reports draw (`train.report`: the loss curve, the
loss scale and gradient norm per log step; `diagnostics.doctor_report`: the first non-finite value,
the loss-scale trajectory, the gradients), so the same finding reads the same wherever it was made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampkit.diagnostics.doctor_report import gradient_section, locator_section, scale_section
from ampkit.report import Report, as_stored
from ampkit.train.report import loss_figure, read_train_records, scale_and_norm_figure

GRADIENT_STEPS = 20
"""The latest measured steps the gradient section draws (metrics.jsonl holds every one)."""


def _fmt(value: Any, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def summary_rows(summary: dict[str, Any]) -> list[list[str]]:
    framework, model = summary["framework"], summary["model"]
    inspected = "yes" if model["inspected"] else "no: see the warning above"
    rows = [
        ["status", summary["status"] + (f": {summary['error']}" if summary.get("error") else "")],
        ["framework", f"{framework['name']} {framework['version']}"],
        ["model", f"{model['cls']} ({_count(model['trainable'])} of {_count(model['parameters'])} parameters trained)"],
        ["inspected by ampkit's hooks", inspected],
        ["precision", summary["precision"]],
        ["device", f"{summary['device']['name']} ({summary['device']['type']})"],
        ["optimizer steps", str(summary["steps"])],
        ["skipped steps (loss scaler)", str(summary["skipped_steps"])],
        ["first / final logged loss", f"{_fmt(summary['first_loss'])} / {_fmt(summary['final_loss'])}"],
        ["final loss scale", _fmt(summary["final_loss_scale"], "g")],
        ["locator", _locator_text(summary)],
        ["wall time (s)", _fmt(summary["wall_s"], ".1f")],
    ]
    inject = summary.get("inject")
    if inject:
        fired = ", ".join(str(s) for s in inject["fired_steps"]) or "never"
        rows.append(["injected fault", f"{inject['spec']} (fired at steps: {fired})"])
    return rows


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _locator_text(summary: dict[str, Any]) -> str:
    mode, armed = summary["settings"]["locator"], summary["locator"]["armed_at"]
    if mode == "auto":
        return (
            f"auto: armed after step {armed}"
            if armed is not None
            else "auto: never armed (no skip, no non-finite loss)"
        )
    return mode


def build_callback_report(summary: dict[str, Any], records: list[dict[str, Any]]) -> Report:
    title = f"ampkit callback: {summary['precision']} in {summary['framework']['name']} ({summary['model']['cls']})"
    report = Report(title, provenance=summary.get("provenance"))
    for warning in summary["warnings"]:
        report.text(warning, kind="warn")
    report.heading("Summary")
    report.table(["metric", "value"], summary_rows(summary))
    if any(r.get("event") == "train" and r.get("loss") is not None for r in records):
        report.heading("Loss")
        report.figure(loss_figure(records, summary), "training loss per logged step")
    fig = scale_and_norm_figure(records)
    if fig is not None:
        report.heading("Loss scale and gradient norm per logged step")
        report.figure(fig, "the framework's GradScaler scale and its gradient norm before clipping")
    if summary["settings"]["locator"] != "off":
        locator_section(report, summary["locator"])
    scale_section(report, summary["scale"])
    steps = [r for r in records if r.get("event") == "grad_stats"][-GRADIENT_STEPS:]
    if steps:
        gradient_section(report, {"scale_range": None, "steps": steps})
    if summary["frozen_layers"]:
        report.heading("Frozen layers (updates lost to rounding)")
        report.table(
            ["layer", "dtype", "since step", "steps", "fix"],
            [[f["name"], f["dtype"], f["since_step"], f["steps"], f["fix"]] for f in summary["frozen_layers"]],
        )
    return report


def write_callback_report(summary: dict[str, Any], run_dir: str | Path) -> tuple[Path, Path]:
    """report.html and report.md into run_dir, from summary (as summary.json stores it) and metrics.jsonl."""
    return build_callback_report(as_stored(summary), read_train_records(run_dir)).write(run_dir)
