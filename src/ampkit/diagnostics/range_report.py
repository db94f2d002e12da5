"""The range audit in doctor's console and report: finding lines (the top offenders only; the scaled
gradients), notes for
what the advice does not cover, and (report) the offenders and the modules with the least headroom.
Everything reads summary.json's `range_audit` block (`diagnostics.range_audit.RangeAudit.to_dict`).
Table headers say "max abs", not "max |x|": a pipe would split report.md's table cells."""

from __future__ import annotations

from typing import Any

from ampkit.report import Report

Row = tuple[str, str]
TOP = 3
"""Offenders named in the finding line (the rest: report.html)."""
TABLE_ROWS = 30
"""Modules listed in the report's table, least headroom first."""
MODULE_COLUMNS = ["module", "class", "max abs out", "max abs in", "max abs w", "headroom (bits)", "underflow %"]
MODULE_COLUMNS += ["status", "grad x scale"]
RULE = "range_exceeds_fp16"
"""`diagnostics.advice.rule_range_audit`'s rule name: its offenders are advice, the others notes."""


def range_rows(audit: dict[str, Any] | None) -> list[Row]:
    """doctor's key findings: the offenders by headroom (top `TOP`), or the least headroom when all fit."""
    if not audit:
        return []
    batches = audit["batches"]
    label = f"range audit ({audit['format']}, {batches} fp32 batch{'' if batches == 1 else 'es'})"
    offenders = audit["offenders"]
    if not offenders:
        least = audit["min_headroom_bits"]
        where = f"least headroom {least:.1f} bits ({audit['tightest']})" if least is not None else "nothing measured"
        return [(label, f"every module fits: {where}"), *_grad_rows(audit)]
    items = [
        f"{o['module']} {o['status']} (max abs {o['max_abs']:.3g}, {o['headroom_bits']:+.2f} bits"
        + (", kept fp32)" if o["kept_fp32"] else ")")
        for o in offenders[:TOP]
    ]
    more = f"; {len(offenders) - TOP} more (report.html)" if len(offenders) > TOP else ""
    return [(label, "; ".join(items) + more), *_grad_rows(audit)]


def _grad_rows(audit: dict[str, Any]) -> list[Row]:
    """The backward side: the scaled gradients that overflow, or how much room the largest one has."""
    if audit.get("grad_max") is None:
        return []
    scale, fits = audit["loss_scale"], audit["fitting_scale"]
    label = f"grads x loss scale {scale:g} ({audit['format']})"
    over = audit["grad_overflows"]
    if not over:
        return [(label, f"fit: largest abs grad {audit['grad_max']:.3g}, init scale up to {fits:g} fits")]
    items = [f"{o['module']} ({o['scaled_max']:.3g}, {o['headroom_bits']:+.2f} bits)" for o in over[:TOP]]
    more = f"; {len(over) - TOP} more" if len(over) > TOP else ""
    room = f"init scale <= {fits:g} fits" if fits >= 1 else "no loss scale fits"
    return [(label, f"overflow in {'; '.join(items)}{more}; {room}")]


def range_notes(audit: dict[str, Any] | None, advice: list[dict[str, Any]]) -> list[str]:
    """Offenders the advice does not cover (a bf16 or fp32 precision; modules already kept in fp32), then
    the audit's own notes (outputs that would be subnormal in fp16)."""
    if not audit:
        return []
    advised = any(a["rule"] == RULE for a in advice)
    lines = []
    for o in audit["offenders"]:
        if o["kept_fp32"]:
            lines.append(
                f"note: {o['module']} reaches |x| {o['max_abs']:.3g} in fp32 ({o['status']} {audit['format']}'s range) "
                "and is "
                "kept in fp32 (--keep-fp32): its consumers must take fp32 values"
            )
        elif not advised:
            lines.append(
                f"note: {o['module']} reaches |x| {o['max_abs']:.3g} in fp32 ({o['status']} {audit['format']}'s "
                f"max {audit['max']:g}): {o['fix']}"
            )
    return lines + [f"note: {line}" for line in audit["notes"]]


def range_section(report: Report, audit: dict[str, Any] | None) -> None:
    if not audit:
        return
    report.heading(f"Range audit: each module's fp32 range against {audit['format']}'s")
    fmt = audit["format"]
    report.text(
        f"Over {audit['batches']} fp32 batches of the initial model, each module's largest finite |output|, "
        f"|input| and |own weight|, against {audit['format']}'s max {audit['max']:g} and smallest normal "
        f"{audit['smallest_normal']:.3g}. Headroom = log2({audit['max']:g} / max |x|) bits: below 0 the value "
        f"is inf in {audit['format']}, below {audit['near_bits']:g} it is one doubling away. Underflow: the share "
        f"of nonzero outputs below the smallest normal (subnormal or zero in {audit['format']}). Gradients: "
        f"each module's largest true-scale abs gradient (at its outputs, or of its own weights) x the initial "
        f"loss scale {audit.get('loss_scale', 1.0):g}, what the backward holds in {fmt}."
    )
    if audit["offenders"]:
        report.table(
            ["fix unit", "born in", "site", "max abs", "headroom (bits)", "status", "fix"],
            [_offender_row(o) for o in audit["offenders"]],
        )
    else:
        report.text(f"Every module fits {audit['format']}'s range with at least {audit['near_bits']:g} bit to spare.")
    if audit.get("grad_overflows"):
        report.table(
            ["module", "site", "max abs grad", f"x {audit['loss_scale']:g}", "headroom (bits)"],
            [_grad_row(o) for o in audit["grad_overflows"][:TABLE_ROWS]],
        )
    measured = [m for m in audit["modules"] if m["headroom_bits"] is not None]
    measured.sort(key=lambda m: m["headroom_bits"])
    report.table(
        MODULE_COLUMNS,
        [_module_row(m) for m in measured[:TABLE_ROWS]],
    )


def _offender_row(o: dict[str, Any]) -> list[str]:
    fix = "kept in fp32" if o["kept_fp32"] else o["fix"]
    return [o["module"], o["origin"], o["site"], f"{o['max_abs']:.3g}", f"{o['headroom_bits']:+.2f}", o["status"], fix]


def _num(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _module_row(m: dict[str, Any]) -> list[str]:
    share = m["underflow_fraction"]
    return [
        m["name"],
        m["cls"],
        _num(m["output_max"]),
        _num(m["input_max"]),
        _num(m["weight_max"]),
        _num(m["headroom_bits"], "+.2f"),
        "-" if share is None else f"{100 * share:.2f}",
        m["status"],
        _num(m.get("grad_scaled_max")),
    ]


def _grad_row(o: dict[str, Any]) -> list[str]:
    return [o["module"], o["site"], f"{o['grad_max']:.3g}", f"{o['scaled_max']:.3g}", f"{o['headroom_bits']:+.2f}"]
