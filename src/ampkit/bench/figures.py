"""The bench report's figures (matplotlib, through ampkit.report's `plt`), from a bench summary."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ampkit.bench.render import (
    COLORS,
    MIB,
    _labels,
    _memory_ratio,
    _ok,
    _profiled,
    _ratio,
    _speedup_note,
    _unit,
    _with_fidelity,
    processed_per_s,
    shows_processed,
)
from ampkit.bench.render_columns import profile_colors, profile_keys
from ampkit.report import plt

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _color(name: str) -> str:
    return COLORS.get(name, "#777777")


def throughput_figure(summary: dict) -> Figure:
    entries = _ok(summary)
    names = [e["name"] for e in entries]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 3.8))
    tps = [e["timing"]["items_per_s"] for e in entries]
    processed = shows_processed(entries)
    if processed:  # masked prompts: the items read stand behind the trained ones, hatched
        read = [processed_per_s(e["timing"]) for e in entries]
        ax_t.bar(names, read, color="none", edgecolor=[_color(n) for n in names], hatch="//", label="processed")
    bars = ax_t.bar(names, tps, color=[_color(n) for n in names], label="trained" if processed else None)
    if processed:
        ax_t.legend(fontsize=8)
    for bar, e in zip(bars, entries):
        ax_t.annotate(
            _ratio(e["vs_fp32"]["speedup"]) + ("*" if _speedup_note(e, summary) else "") if e["vs_fp32"] else "",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    unit = _unit(summary)
    ax_t.set_title(f"{unit}/s (higher is better)")
    ax_t.set_ylabel(f"{unit}/s")
    mem = [e["memory"]["peak_bytes"] / MIB for e in entries]
    bars = ax_m.bar(names, mem, color=[_color(n) for n in names])
    for bar, e in zip(bars, entries):
        ax_m.annotate(
            _memory_ratio(e),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax_m.set_title("peak memory (MiB; lower is better)")
    ax_m.set_ylabel("MiB")
    for ax in (ax_t, ax_m):
        ax.tick_params(axis="x", rotation=15)
        ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def _curve(entry: dict) -> list[float]:
    return [math.nan if v is None else v for v in entry["loss"]["curve"]]


def loss_figure(summary: dict) -> Figure:
    """Left: the loss curves. Right: each minus fp32's, step for step (the curves often overlap)."""
    fig, (ax, ax_gap) = plt.subplots(1, 2, figsize=(11, 3.8))
    entries = _ok(summary)
    ref = next((e for e in entries if e["name"] == summary["reference"]), None)
    for e in entries:
        curve = _curve(e)
        ax.plot(range(1, len(curve) + 1), curve, label=e["name"], color=_color(e["name"]), linewidth=1.2)
        if ref is not None:
            gap = [a - b for a, b in zip(curve, _curve(ref))]
            ax_gap.plot(range(1, len(gap) + 1), gap, label=e["name"], color=_color(e["name"]), linewidth=1.2)
    warmup = summary["config"]["warmup_steps"]
    for axis in (ax, ax_gap):
        if warmup:
            axis.axvline(warmup + 0.5, color="#999", linestyle=":", linewidth=1)
        axis.set_xlabel("step (same batch at the same step everywhere)")
    ax.set_ylabel("training loss")
    ax.set_title("loss curves (dotted: timing starts)")
    ax.legend()
    ax_gap.set_ylabel("loss minus fp32's loss")
    ax_gap.set_title("loss-curve gap vs fp32")
    fig.tight_layout()
    return fig


def step_time_figure(summary: dict) -> Figure:
    entries = _ok(summary)
    fig, ax = plt.subplots(figsize=(11, 3.8))
    data = [e["timing"]["step_ms"] for e in entries]
    box = ax.boxplot(data, patch_artist=True, whis=(5, 95), showfliers=True)
    ax.set_xticks(range(1, len(entries) + 1), [e["name"] for e in entries])
    for patch, e in zip(box["boxes"], entries):
        patch.set_facecolor(_color(e["name"]))
        patch.set_alpha(0.6)
    values = [v for series in data for v in series if v > 0]
    if values and max(values) / min(values) > 20:  # an emulated precision 20x slower squashes the rest
        ax.set_yscale("log")
    ax.set_ylabel("ms per step")
    ax.set_title("step time distribution (box: quartiles; whiskers: 5th-95th percentile)")
    fig.tight_layout()
    return fig


def fidelity_figure(summary: dict) -> Figure:
    """1 - cosine on a log scale: 0.9996 and 0.99 are far apart there, and the thresholds are lines."""
    entries = [e for e in _with_fidelity(summary) if e["name"] != summary["reference"]]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    floor = 1e-9
    width = 0.38
    for offset, key, label, alpha in (
        (-width / 2, "logits_cosine", "logits", 0.9),
        (width / 2, "grad_cosine", "gradients", 0.5),
    ):
        values = [max(floor, 1.0 - (e["fidelity"][key] if e["fidelity"][key] is not None else -1.0)) for e in entries]
        ax.bar(
            [i + offset for i in range(len(entries))],
            values,
            width,
            label=f"1 - cos ({label})",
            alpha=alpha,
            color=[_color(e["name"]) for e in entries],
            edgecolor="#333",
        )
    threshold = 1.0 - summary["config"]["fidelity_threshold"]
    ax.axhline(threshold, color="#c44e52", linestyle="--", linewidth=1, label=f"pass line (cos {1 - threshold:g})")
    ax.axhline(0.1, color="#999", linestyle=":", linewidth=1, label="cos 0.9: error amplified below")
    ax.set_xticks(range(len(entries)), [e["name"] for e in entries])
    ax.set_yscale("log")
    ax.set_ylabel("1 - cosine vs fp32 (lower is closer)")
    ax.set_title("fidelity against fp32 at identical initial weights, fixed batch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def profile_figure(summary: dict) -> Figure:
    """One horizontal bar per precision: its profiled step's milliseconds, stacked by category."""
    entries = _profiled(summary)
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.55 * len(entries)))
    names = [e["name"] for e in entries]
    left = [0.0] * len(entries)
    for key, label, color in zip(profile_keys(summary), _labels(summary), profile_colors(summary)):
        widths = [e["profile"]["ms"].get(key, 0.0) for e in entries]
        ax.barh(names, widths, left=left, color=color, label=label, edgecolor="white", linewidth=0.5)
        for i, (width, e) in enumerate(zip(widths, entries)):
            share = e["profile"]["shares"].get(key, 0.0)
            if share >= 0.08:
                ax.text(left[i] + width / 2, i, f"{share:.0%}", ha="center", va="center", fontsize=8, color="white")
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("ms of the profiled step (torch.profiler; labels: share of the step)")
    ax.set_title("where one training step's time goes")
    ax.legend(fontsize=8, ncol=4, loc="lower right")
    ax.margins(x=0.02)
    fig.tight_layout()
    return fig
