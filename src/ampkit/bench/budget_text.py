"""The budget's words (`bench.budget` keeps the budget itself): how it was kept, for the report, and
the bench's wall time against what it announced, for the console's last line. Seconds throughout."""

from __future__ import annotations


def budget_lines(summary: dict) -> list[str]:
    """How the budget was kept: the promise, the time spent, and each precision it shaped."""
    b = summary.get("budget")
    lines = []
    if b and b.get("bound_s") is not None:
        expected = f"expected ~{b['expected_s']:.0f} s with the reports drawn, " if b.get("expected_s") else ""
        lines.append(
            f"Budget: {b['budget_s']:g} s of measured steps x {b['timed_precisions']} timed precisions; {expected}"
            f"took {b['wall_s']:.0f} s to the summary (measured steps {b['measured_s']:.0f} s, fidelity "
            f"{b['fidelity_s']:.1f} s, start-up {b['startup_s']:.0f} s: {_startup_parts(summary)}), within the "
            f"promise of (budget x precisions + start-up + fidelity) x 1.2 = {b['bound_s']:.0f} s: "
            + ("yes" if b["within_bound"] else "no")
            + "."
        )
    for e in summary["precisions"]:
        reason = (e.get("budget") or {}).get("reason")
        if reason:
            lines.append(f"{e['name']}: {reason}.")
    return lines


def _startup_parts(summary: dict) -> str:
    """ "each worker's start 2.4/2.3/2.3 s, warmup 4.1 s, the bench's own 3.0 s" (older summaries: the plain words)."""
    b = summary["budget"]
    if b.get("worker_startup_s") is None:
        return "processes, models, warmup"
    starts = [(e.get("budget") or {}).get("startup_s") for e in summary["precisions"]]
    each = "/".join(f"{s:.1f}" for s in starts if s is not None)
    return (
        f"each worker's start (process, imports, model) {each} s, warmup {b['warmup_s']:.1f} s, "
        f"the bench's own process {b['parent_s']:.1f} s"
    )


def took_line(summary: dict) -> str | None:
    """ "took 52 s, expected ~55 s": the bench's wall time, its reports drawn, against what it announced."""
    b = summary.get("budget") or {}
    took = b.get("finished_s") or b.get("wall_s")
    if not took or not b.get("expected_s"):
        return None
    off = b["expected_s"] / took - 1.0
    return f"took {took:.0f} s, expected ~{b['expected_s']:.0f} s ({off:+.0%})"
