"""`plan --formats`: the payoff predictor's console tables and report section (summary's `formats` block).

The console fits 80 columns: one GPU gets a row per format (kernel-only, with its quantization, the
step, how many Linear kinds convert); several GPUs a GPU x format grid of the predicted step speedup.
The report holds everything: the GEMM shapes, each GPU's per-Linear verdicts, the torchao filter of
each format, the measured GEMMs (`--measure`). Speedups are ratios over bf16 ("x").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from rich.console import Group

from ampkit.plan.payoff.predict import WORTH_IT
from ampkit.report.console import Footnotes, columns, compact_table


def _x(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2f}x"


def _converts(fmt: dict[str, Any]) -> str:
    return f"{len(fmt['converted_layers'])}/{len(fmt['layers'])}"


def _title(block: dict[str, Any], model: str) -> str:
    return (
        f"Payoff over bf16: {model}, {block['tokens']:,} tokens a micro-batch (roofline at the table's peaks: "
        "ratios, not times)"
    )


def payoff_tables(block: dict[str, Any], model: str) -> list[Any]:
    """What the console prints for the formats block, in order (rich renderables and lines)."""
    if block["note"]:
        return [f"formats: {block['note']}"]
    gpus = block["gpus"]
    if not gpus:
        return ["formats: no GPU of the table has a bf16 peak to compare with"]
    if len(gpus) == 1:
        out: list[Any] = [_one_gpu_table(block, model), _amdahl_line(gpus[0])]
        best = best_format(gpus[0])
        if best is not None:
            out.append(
                f"fastest with a torchao training recipe on {gpus[0]['gpu']}: {best['label']} at "
                f"{_x(best['step_speedup'])} a step; its filter skips {best['filter']['filter_fqns']} (code in "
                "report.html); fidelity: ampkit doctor --what-if"
            )
    else:
        out = [_grid_table(block, model), "kernel-only, per-Linear verdicts and torchao filters: report.html"]
    if block["skipped_gpus"]:
        out.append(f"not compared (no bf16 matrix units): {', '.join(block['skipped_gpus'])}")
    out += measured_lines(block.get("measured"))
    return out


def best_format(gpu: dict[str, Any]) -> dict[str, Any] | None:
    """The fastest predicted format torchao can train in (its filter has no note), if it pays >= 1.05x."""
    predicted = [f for f in gpu["formats"] if f["predicted"] and f["filter"] and not f["filter"]["note"]]
    best = max(predicted, key=lambda f: f["step_speedup"], default=None)
    return best if best is not None and best["step_speedup"] >= WORTH_IT else None


def _one_gpu_table(block: dict[str, Any], model: str) -> Group:
    gpu, notes = block["gpus"][0], Footnotes()
    rows = []
    for fmt in gpu["formats"]:
        if not fmt["predicted"]:
            rows.append([fmt["label"], "-", "-", "-", "-", notes.ref(fmt["note"])])
            continue
        low = fmt["step_speedup"] < WORTH_IT
        rows.append(
            [
                fmt["label"],
                _x(fmt["kernel_only"]),
                _x(fmt["with_overhead"]),
                _x(fmt["step_speedup"]),
                _converts(fmt),
                notes.ref(f"below {WORTH_IT}x a step: stay in bf16" if low else None),
            ]
        )
    headers = ["format", "kernel", "+quant", "step", "Linears", ""]
    title = f"{_title(block, model)} on {gpu['gpu']}"
    legend = (
        "kernel: the block's GEMMs alone; +quant: with the casts; step: whole step, Amdahl; Linears: kinds converted"
    )
    return compact_table(title, columns(headers, notes=1), rows, notes=[*notes.lines(), legend])


def _amdahl_line(gpu: dict[str, Any]) -> str:
    return (
        f"{gpu['gpu']}: the Linears are {gpu['gemm_share']:.0%} of the bf16 step; however fast they get, the "
        f"step gains at most {_x(gpu['amdahl_bound'])} (Amdahl)"
    )


def _grid_table(block: dict[str, Any], model: str) -> Group:
    labels = [c["label"] for c in block["candidates"]]
    rows = []
    for gpu in block["gpus"]:
        by_label = {f["label"]: f for f in gpu["formats"]}
        rows.append([gpu["gpu"], *(_grid_cell(by_label[label]) for label in labels)])
    title = f"{_title(block, model)}: predicted step speedup, quantization included (-: no matrix units for it)"
    return compact_table(title, columns(["GPU", *labels]), rows)


def _grid_cell(fmt: dict[str, Any]) -> str:
    return f"{fmt['step_speedup']:.2f}" if fmt["predicted"] else "-"


def measured_lines(measured: dict[str, Any] | None) -> list[Any]:
    """`--measure`: one line where it was skipped, else a table of measured vs predicted per Linear."""
    if not measured:
        return []
    if measured["skipped"]:
        return [f"--measure: skipped: {measured['skipped']}"]
    rows = []
    for layer in measured["layers"]:
        if "skipped" in layer:
            rows.append([layer["name"], "-", "-", "-", layer["skipped"]])
            continue
        for label, f in layer["formats"].items():
            rows.append([layer["name"], label, _x(f["kernel_only"]), _x(f["with_overhead"]), ""])
    if not rows:
        return [f"--measure on {measured['device']}: nothing timed ({', '.join(measured['not_timed'])} not timed)"]
    title = f"Measured on {measured['device']} (bf16 = 1; eager casts: an upper bound on their cost)"
    headers = ["Linear", "format", "kernel", "+quant", "note"]
    out: list[Any] = [compact_table(title, columns(headers, names=2, notes=1), rows)]
    if measured["not_timed"]:
        out.append(f"not timed: {', '.join(measured['not_timed'])} (--measure times fp8 GEMMs and casts)")
    return out


# ---- the report ----------------------------------------------------------------------------------------


def payoff_section(report, block: dict[str, Any], model: str) -> None:
    """The formats block as report blocks: the assumptions, the shapes, the grid, each GPU's detail."""
    report.heading("Payoff predictor: numeric formats over bf16")
    if block["note"]:
        report.text(block["note"], kind="note")
        return
    report.text(_title(block, model) + ".")
    for line in block["assumptions"]:
        report.text(f"Assumes: {line}.", kind="note")
    report.table(["Linear", "K", "N", "count", "forward", "dgrad", "wgrad"], _shape_rows(block))
    if len(block["gpus"]) > 1:
        report.figure(_grid_figure(block), caption="predicted step speedup over bf16, quantization included")
    for gpu in block["gpus"]:
        _gpu_section(report, gpu)
    _measured_section(report, block.get("measured"))


def _shape_rows(block: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for linear in block["linears"]:
        gemms = {g["pass"]: f"{g['m']}x{g['k']}x{g['n']}" for g in linear["gemms"]}
        rows.append([linear["name"], linear["k"], linear["n"], linear["count"], *gemms.values()])
    return rows


def _gpu_section(report, gpu: dict[str, Any]) -> None:
    report.heading(f"{gpu['gpu']}")
    report.text(_amdahl_line(gpu) + f"; the bf16 step outside the Linears: {_parts(gpu['other'])}.")
    headers = ["format", "kernel-only", "with quantization", "step", "step, casts free", "Linears converted", "note"]
    rows = []
    for f in gpu["formats"]:
        if not f["predicted"]:
            rows.append([f["label"], "-", "-", "-", "-", "-", f["note"]])
            continue
        cells = (f["kernel_only"], f["with_overhead"], f["step_speedup"], f["step_kernel_only"])
        rows.append([f["label"], *map(_x, cells), _converts(f), f["warning"] or ""])
    report.table(headers, rows)
    predicted = [f for f in gpu["formats"] if f["predicted"]]
    if not predicted:
        return
    linear_rows = []
    for i, layer in enumerate(predicted[0]["layers"]):
        verdicts = [_verdict_cell(f["layers"][i]) for f in predicted]
        linear_rows.append([f"{layer['name']} x{layer['count']}", *verdicts])
    report.text("Per Linear: predicted speedup with its casts; * = converts (else the reason it stays bf16).")
    report.table(["Linear", *(f["label"] for f in predicted)], linear_rows)
    for f in predicted:
        if f["filter"]:
            report.text(
                f"{f['label']}: the torchao filter" + (f" ({f['filter']['note']})" if f["filter"]["note"] else "")
            )
            report.code(f["filter"]["code"], language="python")


def _verdict_cell(layer: dict[str, Any]) -> str:
    return (
        f"{layer['with_overhead']:.2f} *" if layer["converted"] else f"{layer['with_overhead']:.2f} ({layer['reason']})"
    )


def _parts(other: dict[str, Any]) -> str:
    parts = ("attention", "elementwise", "loss", "weights", "optimizer")
    return ", ".join(f"{name} {1e3 * other[f'{name}_s']:.3g} ms" for name in parts)


def _measured_section(report, measured: dict[str, Any] | None) -> None:
    if not measured:
        return
    report.heading("Measured GEMMs (--measure)")
    if measured["skipped"]:
        report.text(f"Skipped: {measured['skipped']}.", kind="note")
        return
    rows = []
    for layer in measured["layers"]:
        if "skipped" in layer:
            rows.append([layer["name"], "-", "-", "-", "-", "-", layer["skipped"]])
            continue
        for label, f in layer["formats"].items():
            times = (layer["bf16_s"], f["kernel_s"], f["quantize_s"])
            rows.append(
                [layer["name"], label, *(f"{1e6 * t:.1f}" for t in times), _x(f["kernel_only"]), _x(f["with_overhead"])]
            )
    report.text(f"On {measured['device']}; not timed: {', '.join(measured['not_timed']) or 'none'}.")
    report.table(["Linear", "format", "bf16 us", "GEMMs us", "casts us", "kernel-only", "with casts"], rows)


def _grid_figure(block: dict[str, Any]):
    from ampkit.report import plt

    labels = [c["label"] for c in block["candidates"]]
    names = [g["gpu"] for g in block["gpus"]]
    grid = np.full((len(names), len(labels)), np.nan)
    for i, gpu in enumerate(block["gpus"]):
        for j, f in enumerate(gpu["formats"]):
            if f["predicted"]:
                grid[i, j] = f["step_speedup"]
    fig, ax = plt.subplots(figsize=(1.1 * len(labels) + 2, 0.35 * len(names) + 1.5))
    image = ax.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=0.5, vmax=max(1.5, float(np.nanmax(grid))))
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for i in range(len(names)):
        for j in range(len(labels)):
            if math.isfinite(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=ax, label="step speedup over bf16 (x)")
    return fig
