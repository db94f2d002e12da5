"""`doctor --from RUN --try-fixes`: each fix doctor advises (and each `--also-try KEY=VALUE`) run on the
failing window again, from the same checkpoint: which make it finite, and what each costs.

A fix is run settings (`Advice.settings`, by TrainConfig's names: keep_fp32, init_scale, min_scale,
hysteresis, clip_grad_norm, precision); `ampkit.train.replay_fixes` applies one to the run's config and
replays the window with train's own resume and the same replay (`diagnostics.replay`). This module holds
the parsing of `--also-try`, the record of one fix's replay, its verdict and its rendering.

Verdict: "finite" when the fixed replay ran every step of the window with no non-finite value the loss
scaler did not absorb (an overflow the scaler skipped, with a finite loss, is the scaler doing its job).
Cost: the unfixed replay's throughput over the fixed one's (time per unit trained, 1.25 = 25% slower),
both measured the same way: at the median step time (`ReplayPass.units_per_s`: a step another process
slowed does not move it), with the locator, gradient statistics and one host sync a step attached, so
the tokens/s are a diagnosis's, well below a training run's; the ratio is the figure that compares. A
window of a few steps on a busy machine is noisy: a ratio within ~10% of 1 is no measured cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ampkit.errors import UsageError
from ampkit.precision import ModuleOverrides, canonical_name
from ampkit.records import Record
from ampkit.report.console import Col, Footnotes, compact_table, note_col

FIX_KEYS = {
    "keep-fp32": "keep_fp32",
    "init-scale": "init_scale",
    "min-scale": "min_scale",
    "hysteresis": "hysteresis",
    "clip": "clip_grad_norm",
    "precision": "precision",
}
"""`--also-try` KEY -> the run setting it changes (the keys of `Advice.settings`)."""
KEY_OF = {setting: key for key, setting in FIX_KEYS.items()}
SCALER_SETTINGS = ("init_scale", "min_scale", "hysteresis")
"""settings of the loss scaler: a fix of a run without one (bf16, fp32) changes nothing"""
COST_NOTE = (
    "cost: the unfixed replay's tokens/s over the fix's (1.25 = 25% slower), each at its median step time with "
    "doctor's hooks and one host sync a step (a diagnosis's speed, not a training run's); on a short window or a "
    "busy machine, within ~10% of 1 is noise"
)


def parse_also_try(text: str) -> list[dict[str, Any]]:
    """`--also-try "KEY=VALUE,KEY=VALUE"` -> one settings dict per fix, in order. A piece without "=" continues
    the value before it: `keep-fp32=blocks.0.mlp,blocks.1.mlp` is one fix of two patterns. Bad: one line."""
    pieces: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if pieces and "=" not in part and part:
            pieces[-1] += f",{part}"
        else:
            pieces.append(part)
    return [_parse_fix(piece) for piece in pieces] if text.strip() else []


def _parse_fix(piece: str) -> dict[str, Any]:
    key, equals, value = (s.strip() for s in piece.partition("="))
    if key not in FIX_KEYS or not equals or not value:
        raise UsageError(
            f"--also-try {piece!r}: write KEY=VALUE with KEY one of {', '.join(FIX_KEYS)} "
            "(e.g. keep-fp32=blocks.1.mlp,init-scale=1024)"
        )
    setting = FIX_KEYS[key]
    return {setting: _value(setting, value, piece)}


def _value(setting: str, value: str, piece: str) -> Any:
    """The setting's value from text, checked as its flag checks it."""
    if setting == "precision":
        return canonical_name(value)
    if setting == "keep_fp32":
        ModuleOverrides.keep_fp32(value)  # the pattern's syntax; which modules it names: once the model exists
        return value
    try:
        number = int(value) if setting == "hysteresis" else float(value)
    except ValueError:
        number = math.nan
    least, words = {
        "init_scale": (math.ulp(0.0), "> 0"),
        "min_scale": (0.0, ">= 0"),
        "hysteresis": (1, ">= 1 (a whole number)"),
        "clip_grad_norm": (math.ulp(0.0), "> 0"),
    }[setting]
    if not (math.isfinite(number) and number >= least):
        raise UsageError(f"--also-try {piece!r}: {KEY_OF[setting]} must be a finite number {words}, got {value!r}")
    return number


def fix_label(settings: dict[str, Any]) -> str:
    """ "keep-fp32=blocks.1.mlp", "init-scale=4096 min-scale=4096": the fix as `--also-try` writes it."""
    return " ".join(f"{KEY_OF[k]}={v:g}" if isinstance(v, float) else f"{KEY_OF[k]}={v}" for k, v in settings.items())


@dataclass(frozen=True, kw_only=True)
class Fix:
    """One fix to try: its settings, and where it came from (the advice rule, or "--also-try")."""

    settings: dict[str, Any]
    source: str

    @property
    def label(self) -> str:
        return fix_label(self.settings)


def fixes_to_try(advice: list[dict[str, Any]], also: list[dict[str, Any]]) -> list[Fix]:
    """The advice's fixes that have settings (in the advice's order), then `--also-try`'s; each once."""
    fixes = [Fix(settings=a["settings"], source=a["rule"]) for a in advice if a.get("settings")]
    fixes += [Fix(settings=s, source="--also-try") for s in also]
    seen: dict[str, Fix] = {}
    for fix in fixes:
        seen.setdefault(fix.label, fix)
    return list(seen.values())


@dataclass(frozen=True, kw_only=True)
class FixOutcome(Record):
    """One window replayed with one fix (or without: the unfixed replay), as summary.json's `try_fixes` keeps it."""

    fix: str
    """the fix as `--also-try` writes it ("keep-fp32=blocks.1.mlp"); "none" for the unfixed replay"""
    source: str
    """the advice rule that named it, "--also-try", or "unfixed" (the replay without a fix)"""
    settings: dict[str, Any] = field(default_factory=dict)
    finite: bool = False
    first_nonfinite_step: int | None = None
    where: str | None = None
    """module (phase) of the first non-finite value, when the locator found one"""
    steps_run: int = 0
    tokens_per_s: float | None = None
    """the task's units trained per second of the replay (`unit`), doctor's hooks included"""
    cost_ratio: float | None = None
    """the unfixed replay's tokens/s over this one's: 1.25 = 25% slower (None: either did not run)"""
    error: str | None = None
    """why the fix could not be run (a setting this device or run refuses): then it is not finite"""


def outcome(fix: Fix | None, replay, *, last_step: int, unfixed_rate: float | None) -> FixOutcome:
    """A replay's (`diagnostics.replay.ReplayPass`) verdict: finite through `last_step`, or where it went bad."""
    site = replay.site()
    rate = replay.units_per_s
    return FixOutcome(
        fix=fix.label if fix else "none",
        source=fix.source if fix else "unfixed",
        settings=dict(fix.settings) if fix else {},
        finite=site is None and bool(replay.steps) and replay.steps[-1] == last_step,
        first_nonfinite_step=site[0] if site else None,
        where=f"{site[1]} ({site[2]})" if site and site[1] != "?" else None,
        steps_run=len(replay.steps),
        tokens_per_s=rate,
        cost_ratio=unfixed_rate / rate if rate and unfixed_rate else None,
    )


def try_fixes_block(
    unfixed: FixOutcome, fixes: list[FixOutcome], *, unit: str, window: dict[str, int]
) -> dict[str, Any]:
    """summary.json's `try_fixes`: the unit, the window, the unfixed replay and each fix's outcome."""
    return {
        "unit": unit,
        "window": window,
        "unfixed": unfixed.to_dict(),
        "fixes": [f.to_dict() for f in fixes],
        "note": COST_NOTE,
    }


def _result(item: dict[str, Any], notes: Footnotes | None) -> str:
    if item.get("error"):
        return notes.mark("not run", item["error"]) if notes is not None else f"not run: {item['error']}"
    if item["finite"]:
        return f"finite ({item['steps_run']} steps)"
    where = f" in {item['where']}" if item["where"] else ""
    return f"non-finite at step {item['first_nonfinite_step']}{where}"


def try_fixes_rows(block: dict[str, Any], notes: Footnotes | None = None) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the fixes' table (console and report): the unfixed replay first. `notes`: why a
    fix was not run goes there (the console's footnotes), else into its cell (the report)."""
    unit = block["unit"]
    headers = ["fix", "result", f"{unit}/s", "cost vs unfixed"]
    rows = []
    for item in [block["unfixed"], *block["fixes"]]:
        rate, cost = item["tokens_per_s"], item["cost_ratio"]
        name = "none (the run's settings)" if item["source"] == "unfixed" else item["fix"]
        rows.append(
            [
                name,
                _result(item, notes),
                "-" if rate is None else f"{rate:,.0f}",
                "-" if cost is None else f"{cost:.2f}x",
            ]
        )
    return headers, rows


def print_try_fixes(console, block: dict[str, Any] | None) -> None:
    """The fixes' table on `console` (rich), the fix and result columns wrapping between words."""
    if not block:
        return
    notes = Footnotes()
    headers, rows = try_fixes_rows(block, notes)
    window = block["window"]
    title = (
        f"Fixes tried on steps {window['first']}-{window['last']} (from the checkpoint at step {window['checkpoint']})"
    )
    cols = [note_col(headers[0]), note_col(headers[1]), Col(headers[2]), Col(headers[3])]
    console.print(compact_table(title, cols, rows, notes=[*notes.lines(), block["note"]]))


def try_fixes_section(report, block: dict[str, Any] | None) -> None:
    """The report's section (an `ampkit.report.Report`): the table and the note on the cost."""
    if not block:
        return
    window = block["window"]
    report.heading("Fixes tried on the window")
    report.text(
        f"Each fix replayed steps {window['first']}-{window['last']} from the checkpoint at step "
        f"{window['checkpoint']}, the run's settings otherwise; finite: the whole window ran with no "
        "non-finite value the loss scaler did not absorb."
    )
    headers, rows = try_fixes_rows(block)
    report.table(headers, rows)
    report.text(block["note"][0].upper() + block["note"][1:] + ".", kind="note")
