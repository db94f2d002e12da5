"""`ampkit train`'s report.html and report.md: loss and throughput curves, loss scale, gradient norm,
each rank's step time and straggler score (a data-parallel run), held-out loss and the config, from
metrics.jsonl and summary.json alone (written by rank 0 at the end of a run, and again by
`ampkit report RUN_DIR`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampkit.report import Report, as_stored, plt
from ampkit.runs import METRICS_FILE

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_BLUE, _ORANGE = "#4c72b0", "#dd8452"


def read_train_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records (a torn last line, left by a killed writer, is skipped); [] without the file."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the train records whose `key` is a finite number."""
    points = [(r["step"], r[key]) for r in records if r.get("event") == "train" and _finite(r.get(key))]
    return [s for s, _ in points], [v for _, v in points]


def _fmt(value: Any, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec) if _finite(value) else str(value)


def summary_rows(summary: dict[str, Any]) -> list[list[str]]:
    unit = summary["unit"]
    rows = [
        ["status", summary.get("status", "-") + (f": {summary['error']}" if summary.get("error") else "")],
        ["steps", str(summary["steps"])],
        ["first / final train loss", f"{_fmt(summary['first_loss'])} / {_fmt(summary['final_loss'])}"],
        ["held-out loss (start -> end)", f"{_fmt(summary['eval_loss_initial'])} -> {_fmt(summary['eval_loss'])}"],
        [f"trained {unit}/s (after warmup)", _fmt(summary["items_per_s"], ",.0f")],
        [f"processed {unit}/s (masked ones too; MFU's count)", _fmt(_processed(summary), ",.0f")],
        ["step time median (ms)", _fmt(summary["step_ms_median"], ".1f")],
        ["skipped steps", str(summary["skipped_steps"])],
        ["final loss scale", _fmt(summary["final_loss_scale"], "g")],
        ["wall time (s)", _fmt(summary.get("wall_s"), ".1f")],
    ]
    for name, value in (summary.get("peak_memory") or {}).items():  # e.g. max_rss_bytes, max_allocated_bytes
        rows.append([f"peak memory: {name.removesuffix('_bytes')} (MiB, 1024^2 B)", _fmt(value / 2**20, ",.0f")])
    if (summary.get("guard") or {}).get("enabled"):
        rows.append(["NaN guard rollbacks", str(summary["guard"]["rollbacks"])])
    found = (summary.get("diagnostics") or {}).get("first_nonfinite")
    if found:
        rank = f", rank {found['rank']}" if "rank" in found else ""  # a data-parallel run's
        rows.append(["first non-finite", f"{found['module']} ({found['phase']}, step {found['step']}{rank})"])
    return rows


def rank_rows(ranks: list[dict[str, Any]]) -> list[list[str]]:
    """One row per rank: its step time median and p90 (ms) and its straggler score (1.00 = fastest)."""
    return [
        [
            str(r["rank"]),
            _fmt(r["step_ms_median"], ".1f"),
            _fmt(r["step_ms_p90"], ".1f"),
            _fmt(r["straggler"], ".2f"),
            str(r["windows"]),
        ]
        for r in ranks
    ]


RANKS_NOTE = (
    "Each rank's own step time over its measured log windows (the warm-up windows left out), gathered "
    "once at the end of the run; straggler = the rank's median over the fastest rank's (1.00 = fastest). "
    "A rank's time includes its waits at the gradient syncs, where every rank waits for the slowest: "
    "scores part for a rank slow outside the syncs (data, optimizer step, host work)."
)


def _processed(summary: dict[str, Any]) -> Any:
    """Processed items/s; a summary written before the token account had no masks: its trained rate."""
    return summary.get("processed_per_s", summary["items_per_s"])


def config_rows(config: dict[str, Any], prefix: str = "") -> list[list[str]]:
    """The config as (setting, value) rows; a section's settings under its name (`lora.lora`)."""
    rows = []
    for key, value in config.items():
        if isinstance(value, dict):
            rows += config_rows(value, f"{prefix}{key}.")
        else:
            rows.append([f"{prefix}{key}", json.dumps(value)])
    return rows


def _curve(ax: Axes, steps: list[int], values: list[float], *, label: str, color: str = _BLUE) -> None:
    ax.plot(steps, values, color=color, lw=1.2, label=label)


def loss_figure(records: list[dict[str, Any]], summary: dict[str, Any]) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 3.4))
    _curve(ax, *_series(records, "loss"), label="train loss (log steps)")
    evals = [(e["step"], e["eval_loss"]) for e in summary.get("eval_history") or [] if _finite(e.get("eval_loss"))]
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], "o--", color=_ORANGE, label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def throughput_figure(records: list[dict[str, Any]], unit: str) -> Figure:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2))
    trained = _series(records, "tokens_per_s")  # the task's trained items/s (key name kept)
    processed = _series(records, "processed_tokens_per_s")
    if processed[1] and processed != trained:  # masked prompts: the items read, beside the trained ones
        _curve(left, *processed, label=f"processed {unit}/s (masked too)", color=_ORANGE)
    _curve(left, *trained, label=f"trained {unit}/s")
    left.set_title(f"{unit}/s per log window")
    left.legend(fontsize=8)
    _curve(right, *_series(records, "step_ms"), label="step ms", color=_ORANGE)
    right.set_title("step time, ms")
    for ax in (left, right):
        ax.set_xlabel("step")
    fig.tight_layout()
    return fig


def scale_and_norm_figure(records: list[dict[str, Any]]) -> Figure | None:
    """Loss scale (fp16) and gradient norm (before clipping) per log step; log y where they span decades."""
    scale_steps, scales = _series(records, "loss_scale")
    norm_steps, norms = _series(records, "grad_norm")
    panels = [
        (s, v, t, c)
        for s, v, t, c in ((scale_steps, scales, "loss scale", _ORANGE), (norm_steps, norms, "gradient norm", _BLUE))
        if v
    ]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.2), squeeze=False)
    for ax, (steps, values, title, color) in zip(axes[0], panels):
        _curve(ax, steps, values, label=title, color=color)
        if min(values) > 0:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    return fig


def build_train_report(summary: dict[str, Any], records: list[dict[str, Any]]) -> Report:
    config, unit = summary["config"], summary["unit"]
    report = Report(
        f"ampkit train: {config['precision']} on {summary['model']['preset']}", provenance=summary.get("provenance")
    )
    if summary.get("error"):
        report.text(f"The run ended {summary['status']}: {summary['error']}", kind="warn")
    for warning in summary.get("warnings") or []:
        report.text(warning, kind="warn")
    report.heading("Summary")
    report.table(["metric", "value"], summary_rows(summary))
    if not records:
        report.text(f"{METRICS_FILE} is missing or empty: no curves to draw.", kind="warn")
    if _series(records, "loss")[0]:
        report.heading("Loss")
        report.figure(loss_figure(records, summary), "training loss per log step and held-out loss")
    if _series(records, "tokens_per_s")[0]:
        report.heading("Throughput")
        report.figure(throughput_figure(records, unit), f"{unit}/s and step time per log window")
    fig = scale_and_norm_figure(records)
    if fig is not None:
        report.heading("Loss scale and gradient norm")
        report.figure(fig, "loss scale (fp16's GradScaler) and the gradient norm before clipping")
    if summary.get("ranks"):
        report.heading("Ranks")
        report.text(RANKS_NOTE)
        report.table(["rank", "step ms median", "step ms p90", "straggler", "windows"], rank_rows(summary["ranks"]))
    if summary.get("eval_history"):
        report.heading("Held-out loss")
        report.table(["step", "eval loss"], [[e["step"], _fmt(e["eval_loss"])] for e in summary["eval_history"]])
    if summary.get("lora"):
        report.heading("LoRA")
        report.table(["setting", "value"], config_rows(summary["lora"]))
    report.heading("Config")
    report.table(["setting", "value"], config_rows(config))
    return report


def write_train_report(summary: dict[str, Any], run_dir: str | Path) -> tuple[Path, Path]:
    """report.html and report.md into run_dir, from summary (as summary.json stores it) and metrics.jsonl."""
    return build_train_report(as_stored(summary), read_train_records(run_dir)).write(run_dir)
