"""The what-if ledger in doctor's console and report: one finding line, then (report) a heat map of each
Linear's relative error per format and tensor, the tables behind it and the layers that stay in bf16."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ampkit.report import Report, plt

Row = tuple[str, str]


def what_if_rows(what_if: dict[str, Any] | None) -> list[Row]:
    """doctor's key findings: what the ledger covered and how many Linears stay in bf16 per format."""
    if not what_if:
        return []
    layers = len(what_if["layers"])
    kept = ", ".join(f"{fmt} {len(rows)}" for fmt, rows in what_if["keep_bf16"].items())
    text = f"{layers} Linears x {len(what_if['formats'])} formats over {what_if['batches']} fp32 batches"
    return [("what-if ledger", f"{text}; stay in bf16: {kept or 'none'} (report.html)")]


def what_if_section(report: Report, what_if: dict[str, Any] | None) -> None:
    if not what_if:
        return
    report.heading("What if: each Linear's GEMM inputs in each format")
    report.text(
        f"From {what_if['batches']} fp32 batches, each Linear's weight, input and output gradient rounded to each "
        "format and back (blocks along the last dimension), against itself: relative error, share of nonzero "
        "elements flushed to zero, share saturated, and dynamic range in binades against the format's."
    )
    report.figure(_heat_map(what_if), "log10 relative error per Linear (rows) and format (columns), per tensor.")
    report.heading("Which Linears stay in bf16")
    for fmt, rows in what_if["keep_bf16"].items():
        listed = "; ".join(f"{r['layer']} ({r['why']})" for r in rows) or "none"
        report.text(f"{fmt}: {listed}.")
    for note in what_if["notes"]:
        report.text(note, kind="note")
    ranges = ", ".join(f"{fmt} {binades:.1f}" for fmt, binades in what_if["format_range_binades"].items())
    report.text(f"Element range of each format, binades (block formats: within one block): {ranges}.")
    for tensor in what_if["tensors"]:
        report.table(*_tensor_table(what_if, tensor))


def _tensor_table(what_if: dict[str, Any], tensor: str) -> tuple[list[str], list[list[str]]]:
    """One tensor's cells: per Linear, its range, then per format error / flushed / saturated."""
    formats = what_if["formats"]
    headers = [f"{tensor}: Linear", "range (binades)", *formats]
    rows = []
    for layer in what_if["layers"]:
        cells = [layer["formats"][f].get(tensor) for f in formats]
        known = next((c for c in cells if c), None)
        rows.append([layer["name"], f"{known['range_binades']:.1f}" if known else "-", *(_cell(c) for c in cells)])
    return headers, rows


def _cell(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    text = f"{cell['rel_error']:.2e}"
    if cell["flushed"]:
        text += f" 0:{cell['flushed']:.1%}"
    if cell["saturated"]:
        text += f" sat:{cell['saturated']:.1%}"
    return text


def _heat_map(what_if: dict[str, Any]):
    formats, tensors, layers = what_if["formats"], what_if["tensors"], what_if["layers"]
    fig, axes = plt.subplots(1, len(tensors), figsize=(3.2 * len(tensors) + 2, max(3, 0.2 * len(layers) + 1.5)))
    axes = np.atleast_1d(axes)
    grids = [_grid(layers, formats, tensor) for tensor in tensors]
    finite = [v for grid in grids for v in grid.flat if math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (-4.0, 0.0)
    image = None
    for ax, tensor, grid in zip(axes, tensors, grids):
        image = ax.imshow(grid, aspect="auto", cmap="magma_r", vmin=low, vmax=high, interpolation="nearest")
        ax.set_title(tensor, fontsize=9)
        ax.set_xticks(range(len(formats)), formats, rotation=60, fontsize=7)
        ax.set_yticks(range(len(layers)), [layer["name"] for layer in layers] if ax is axes[0] else [], fontsize=6)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="log10 relative error")
    return fig


def _grid(layers: list[dict[str, Any]], formats: list[str], tensor: str) -> np.ndarray:
    grid = np.full((len(layers), len(formats)), np.nan)
    for i, layer in enumerate(layers):
        for j, fmt in enumerate(formats):
            cell = layer["formats"][fmt].get(tensor)
            if cell and cell["rel_error"] > 0:
                grid[i, j] = math.log10(cell["rel_error"])
    return grid
