"""Rendering doctor's result: the console view (rich) and report.html / report.md with plots
(gradient-norm heat map, underflow fractions, loss-scale trajectory, smoke curves, per-layer fidelity),
the range audit's rows and tables (`range_report`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from ampkit.diagnostics.range_report import range_notes, range_rows, range_section
from ampkit.diagnostics.replay import replay_rows, replay_section
from ampkit.diagnostics.try_fixes import print_try_fixes, try_fixes_section
from ampkit.diagnostics.whatif_report import what_if_rows, what_if_section
from ampkit.report import Report, as_stored, plt
from ampkit.report.console import key_value_table, labelled_lines


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


Row = tuple[str, str]
"""(label, value) of one key finding."""


def key_findings(summary: dict[str, Any]) -> list[Row]:
    """(label, value) rows shared by the console and the report: the verdict's evidence. A value near
    fp16's max is one of them only when the verdict found problems; otherwise it is a note (`notes`)."""
    rng = summary["gradients"]["scale_range"]
    return [
        *_subject_rows(summary),
        *replay_rows(summary.get("replay")),  # doctor --from RUN: the run, its window and the verdict
        *_interrupted_rows(summary.get("interrupted")),
        *_locator_rows(summary["locator"], near_max=summary["status"] == "problems"),
        *range_rows(summary.get("range_audit")),
        _diagnostic_run_row(summary["run"]),
        ("loss scale", _scale_text(summary["scale"])),
        *([_scale_range_row(rng)] if rng else []),
        *_long_tail_rows(summary["gradients"]["long_tail"]),
        *(_smoke_row(name, smoke) for name, smoke in summary["smoke"].items()),
        *_fidelity_rows(summary["fidelity"]),
        *what_if_rows(summary.get("what_if")),
    ]


def _subject_rows(summary: dict[str, Any]) -> list[Row]:
    """What was diagnosed: precision and device, model, and the injected fault if any."""
    rows = [
        ("precision", f"{summary['config']['precision']} on {summary['device']['name']}"),
        ("model", f"{summary['model']['preset']} ({summary['model']['parameters']:,} parameters)"),
    ]
    inject = summary["inject"]
    if inject:
        rows.append(("injected fault", f"{inject['spec']} (fired at steps {inject['fired_steps']})"))
    return rows


def notes(summary: dict[str, Any]) -> list[str]:
    """Observations that are no problem, printed after the advice (never in the verdict's table): a value
    near fp16's max when nothing overflowed, and the range audit's offenders the advice does not cover."""
    near = summary["locator"].get("first_near_fp16_max")
    audit = range_notes(summary.get("range_audit"), summary["advice"])
    if not near or summary["status"] == "problems":
        return audit
    return [
        f"note: {near['module']}'s {near['phase']} {near['site']} came near fp16's max 65504 "
        f"({near['values']}), and nothing overflowed: no problem, shown for reference",
        *audit,
    ]


def _interrupted_rows(interrupted: dict[str, Any] | None) -> list[Row]:
    if not interrupted:
        return []
    finished = ", ".join(interrupted["finished"]) or "none"
    return [("interrupted", f"by {interrupted['signal']} during {interrupted['during']}; parts finished: {finished}")]


def _locator_rows(locator: dict[str, Any], *, near_max: bool = True) -> list[Row]:
    """The first non-finite value, the overflows the scaler absorbed, the first value near fp16's max
    (`near_max`: only when the verdict found problems; else it is a note)."""
    loc = locator.get("first_nonfinite")
    first_nonfinite = (
        f"{loc['module']} ({loc['cls']}), {loc['phase']} {loc['site']}, step {loc['step']}: {loc['values']}"
        if loc
        else "none"
    )
    rows = [("first non-finite", first_nonfinite)]
    overflows = locator["scaler_overflows"]
    if overflows:
        first = overflows[0]
        rows.append(
            (
                "overflows the loss scaler absorbed",
                f"{len(overflows)}, first at {first['module']} "
                f"({first['phase']} {first['site']}, step {first['step']})",
            )
        )
    near = locator.get("first_near_fp16_max")
    if near and near_max:
        rows.append(
            ("first value near fp16 max", f"{near['module']}, {near['phase']} {near['site']}: {near['values']}")
        )
    return rows


def _diagnostic_run_row(run: dict[str, Any]) -> Row:
    bad = run["nonfinite_loss_steps"]
    if bad:
        return ("diagnostic run", f"{run['steps']} steps, non-finite loss at {len(bad)} of them")
    return ("diagnostic run", f"{run['steps']} steps, all losses finite")


def _scale_range_row(rng: dict[str, Any]) -> Row:
    if rng["representable"]:
        return ("representable loss scales", f"{rng['low_pow2']:g} .. {rng['high_pow2']:g}")
    return (
        "representable loss scales",
        f"none (underflow needs >= {rng['low_pow2']:g}, overflow <= {rng['high_pow2']:g})",
    )


def _long_tail_rows(tail: dict[str, Any] | None) -> list[Row]:
    if not tail:
        return []
    return [("gradient long tail", f"{tail['layer']}: {tail['ratio']:.0f}x the median layer norm")]


def _smoke_row(name: str, smoke: dict[str, Any]) -> Row:
    if smoke["passed"]:
        return (f"smoke test ({name})", "passed in " + str(smoke["steps_needed"]) + " steps")
    return (f"smoke test ({name})", f"FAILED ({smoke['failure']}, accuracy {100 * smoke['final_accuracy']:.1f}%)")


def _fidelity_rows(fid: dict[str, Any] | None) -> list[Row]:
    if not fid:
        return []
    return [
        (
            "fidelity vs fp32",
            f"logits cosine {_fmt(fid['logits_cosine'], '.5f')} ({fid['verdict']}); "
            f"first layer below {fid['threshold']}: {fid['first_below'] or 'none'}",
        )
    ]


def _scale_text(scale: dict[str, Any]) -> str:
    if not scale["active"]:
        return "no loss scaling in this precision"
    text = (
        f"{scale['initial']:g} -> {_fmt(scale['final'], 'g')}, {scale['skipped']} skipped of {scale['steps']}, "
        f"{scale['growths']} growths, {scale['backoffs']} backoffs"
    )
    if scale["collapsed_at"]:
        text += f", collapsed below min_scale at step {scale['collapsed_at']}"
    return text


def print_console(console: Console, summary: dict[str, Any], run_dir) -> None:
    """The key findings (a value wraps between words at the console's width), then the numbered advice."""
    title = f"ampkit doctor · {summary['config']['precision']} · {summary['status']}"
    console.print(key_value_table(title, key_findings(summary)))
    styles = {"fix": "bold red", "warn": "yellow", "info": "green"}
    for number, item in enumerate(summary["advice"], 1):
        console.print(f"{number}. {item['title']}", style=styles.get(item["severity"], ""), markup=False)
        console.print(labelled_lines([*(("evidence:", line) for line in item["evidence"]), ("fix:", item["fix"])]))
    for line in notes(summary):
        console.print(line, style="dim", highlight=False, markup=False)
    print_try_fixes(console, summary.get("try_fixes"))  # doctor --from RUN --try-fixes
    if run_dir is not None:
        console.print(f"report: {run_dir / 'report.html'}", highlight=False, markup=False, soft_wrap=True)


def write_report(summary: dict[str, Any], run_dir: str | Path) -> tuple[Path, Path]:
    """report.html and report.md into run_dir, from the summary as summary.json stores it."""
    return build_report(as_stored(summary)).write(run_dir)


def build_report(summary: dict[str, Any]) -> Report:
    title = f"ampkit doctor: {summary['config']['precision']} on {summary['model']['preset']}"
    report = Report(title=title, provenance=summary.get("provenance"))
    report.heading("Verdict").table(["finding", "value"], [list(r) for r in key_findings(summary)])
    for line in notes(summary):
        report.text(line, kind="note")
    report.heading("Advice")
    for item in summary["advice"]:
        report.text(f"{item['title']}. Fix: {item['fix']}", kind="warn" if item["severity"] != "info" else "note")
        for line in item["evidence"]:
            report.text(f"Evidence: {line}")
    try_fixes_section(report, summary.get("try_fixes"))
    replay_section(report, summary.get("replay"))
    locator_section(report, summary["locator"])
    range_section(report, summary.get("range_audit"))
    scale_section(report, summary["scale"])
    gradient_section(report, summary["gradients"])
    _smoke_section(report, summary["smoke"])
    _fidelity_section(report, summary["fidelity"])
    what_if_section(report, summary.get("what_if"))
    return report


def locator_section(report: Report, locator: dict[str, Any]) -> None:
    report.heading("First non-finite value")
    first = locator["first_nonfinite"]
    if not first:
        report.text("No inf or nan appeared in any module's weights, inputs, outputs or gradients.")
    else:
        report.text(first["explanation"], kind="warn")
        rows = []
        for frame in first["frames"][-12:]:
            for site, s in frame["stats"].items():
                rows.append(
                    [
                        frame["index"],
                        frame["step"],
                        frame["module"],
                        frame["phase"],
                        site,
                        f"{s['absmin']:.3g}",
                        f"{s['absmax']:.3g}",
                        s["n_inf"],
                        s["n_nan"],
                        s["dtype"],
                    ]
                )
        report.table(["frame", "step", "module", "phase", "site", "min |x|", "max |x|", "inf", "nan", "dtype"], rows)
    if locator["near_limits"]:
        report.text("Sites near fp16's limits (|x| > 65504/2, or nonzero values that flush to zero in fp16):")
        report.table(
            ["module", "phase", "site", "max |x|", "near max", "flush to 0", "elements"],
            [
                [n["module"], n["phase"], n["site"], f"{n['absmax']:.3g}", n["near_max"], n["fp16_flush"], n["numel"]]
                for n in locator["near_limits"][:30]
            ],
        )


def scale_section(report: Report, scale: dict[str, Any]) -> None:
    report.heading("Loss-scale trajectory")
    report.text(_scale_text(scale))
    points = scale["points"]
    if not points:
        return
    fig, ax = plt.subplots(figsize=(7, 3))
    steps = [p["step"] for p in points]
    ax.step(steps, [p["scale"] for p in points], where="post", label="loss scale")
    skipped = [p for p in points if p["skipped"]]
    ax.scatter(
        [p["step"] for p in skipped],
        [p["scale"] for p in skipped],
        color="red",
        marker="x",
        label="skipped step",
        zorder=3,
    )
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("scale")
    ax.legend()
    report.figure(fig, "Loss scale after each step; red crosses are steps the scaler skipped (inf/nan gradients).")


def gradient_section(report: Report, grads: dict[str, Any]) -> None:
    report.heading("Gradients")
    rng, steps = grads["scale_range"], grads["steps"]
    if rng is None and not steps:  # an interrupted diagnosis, before the gradient snapshot
        report.text("Not measured: the diagnosis was interrupted first.")
        return
    if rng is not None:  # a replay (doctor --from RUN) takes no snapshot: its steps' statistics only
        report.text(
            f"Loss scales keeping fp32 gradients representable in fp16 (<= {100 * rng['flush_tolerance']:g}% "
            f"flushed to zero, max |g·scale| <= 65504): {rng['low_pow2']:g} .. {rng['high_pow2']:g}"
            + ("" if rng["representable"] else " (empty: no scale fits)")
            + f"; max |g| = {rng['max_abs']:.3g}."
        )
    if not steps:
        return
    names = [t["name"] for t in steps[0]["tensors"]]
    matrix = np.full((len(names), len(steps)), np.nan)
    for j, step in enumerate(steps):
        by_name = {t["name"]: t["norm"] for t in step["tensors"]}
        for i, name in enumerate(names):
            value = by_name.get(name, math.nan)
            matrix[i, j] = math.log10(value) if value > 0 and math.isfinite(value) else np.nan
    fig, ax = plt.subplots(figsize=(8, max(3, 0.18 * len(names))))
    image = ax.imshow(matrix, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.set_xticks(range(len(steps)), [s["step"] for s in steps], fontsize=7)
    ax.set_xlabel("step")
    fig.colorbar(image, ax=ax, label="log10 gradient norm")
    report.figure(fig, "Gradient-norm heat map per parameter tensor (blank = non-finite).")
    last = steps[-1]
    fig, ax = plt.subplots(figsize=(8, max(3, 0.18 * len(names))))
    y = np.arange(len(last["tensors"]))
    ax.barh(y, [100 * t["flush_fraction"] for t in last["tensors"]], label="flush to zero")
    ax.barh(
        y,
        [100 * t["subnormal_fraction"] for t in last["tensors"]],
        left=[100 * t["flush_fraction"] for t in last["tensors"]],
        label="subnormal",
    )
    ax.set_yticks(y, [t["name"] for t in last["tensors"]], fontsize=6)
    ax.set_xlabel(f"% of elements at loss scale {last['scale']:g} (step {last['step']})")
    ax.legend()
    report.figure(fig, "Underflow forecast: share of each gradient that fp16 would flush to zero or make subnormal.")
    report.table(
        ["layer", "norm", "max |g|", "flush %", "subnormal %", "headroom"],
        [
            [
                t["name"],
                f"{t['norm']:.3g}",
                f"{t['max_abs']:.3g}",
                f"{100 * t['flush_fraction']:.2f}",
                f"{100 * t['subnormal_fraction']:.2f}",
                f"{t['headroom']:.3g}",
            ]
            for t in last["layers"]
        ],
    )


def _smoke_section(report: Report, smoke: dict[str, Any]) -> None:
    if not smoke:
        return
    report.heading("Smoke test: overfit 16 samples")
    fig, ax = plt.subplots(figsize=(7, 3))
    for name, result in smoke.items():
        report.text(result["diagnosis"], kind="note" if result["passed"] else "warn")
        ax.plot(range(1, len(result["accuracy"]) + 1), [100 * a for a in result["accuracy"]], label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("token accuracy %")
    ax.legend()
    report.figure(fig, "Token accuracy on the 16 samples, per step.")


def _fidelity_section(report: Report, fidelity: dict[str, Any] | None) -> None:
    if not fidelity:
        return
    report.heading("Per-layer fidelity against fp32")
    report.table(
        ["layer", "cosine", "relative error"],
        [
            [layer["name"], _fmt(layer["cosine"], ".6f"), _fmt(layer["rel_error"], ".3g")]
            for layer in fidelity["layers"]
        ],
    )
