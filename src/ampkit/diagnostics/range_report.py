"""The range audit in doctor's console and report: one finding line (the top offenders only), notes for
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
        return [(label, f"every module fits: {where}")]
    items = [
        f"{o['module']} {o['status']} (max abs {o['max_abs']:.3g}, {o['headroom_bits']:+.2f} bits"
        + (", kept fp32)" if o["kept_fp32"] else ")")
        for o in offenders[:TOP]
    ]
    more = f"; {len(offenders) - TOP} more (report.html)" if len(offenders) > TOP else ""
    return [(label, "; ".join(items) + more)]


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
                f"note: {o['module']} reaches |x| {o['max_abs']:.3g} in fp32 ({o['status']} fp16's range) and is "
                "kept in fp32 (--keep-fp32): its consumers must take fp32 values"
            )
        elif not advised:
            lines.append(
                f"note: {o['module']} reaches |x| {o['max_abs']:.3g} in fp32 ({o['status']} fp16's max "
                f"{audit['max']:g}): no problem in this precision; under fp16, {o['fix']}"
            )
    return lines + [f"note: {line}" for line in audit["notes"]]


def range_section(report: Report, audit: dict[str, Any] | None) -> None:
    if not audit:
        return
    report.heading(f"Range audit: each module's fp32 range against {audit['format']}'s")
    report.text(
        f"Over {audit['batches']} fp32 batches of the initial model, each module's largest finite |output|, "
        f"|input| and |own weight|, against {audit['format']}'s max {audit['max']:g} and smallest normal "
        f"{audit['smallest_normal']:.3g}. Headroom = log2({audit['max']:g} / max |x|) bits: below 0 the value "
        f"is inf in {audit['format']}, below {audit['near_bits']:g} it is one doubling away. Underflow: the share "
        f"of nonzero outputs below the smallest normal (subnormal or zero in {audit['format']})."
    )
    if audit["offenders"]:
        report.table(
            ["fix unit", "born in", "site", "max abs", "headroom (bits)", "status", "fix"],
            [_offender_row(o) for o in audit["offenders"]],
        )
    else:
        report.text(f"Every module fits {audit['format']}'s range with at least {audit['near_bits']:g} bit to spare.")
    measured = [m for m in audit["modules"] if m["headroom_bits"] is not None]
    measured.sort(key=lambda m: m["headroom_bits"])
    report.table(
        ["module", "class", "max abs out", "max abs in", "max abs w", "headroom (bits)", "underflow %", "status"],
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
    ]
