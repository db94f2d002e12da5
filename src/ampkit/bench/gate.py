"""The convergence gate (`bench --gate 0.01 --steps N`): every candidate's loss against fp32's, step for step.

A candidate passes when the absolute gap of its loss to fp32's stays within the gate at every matched step
after warm-up: the acceptance bar fp8 adopters use (a matched-step loss gap of about 0.01). The steps
match because `--steps` gives every precision the same measured steps, and every worker draws the same
seeded batches from the same initial weights; a run on a reduced batch is not comparable and fails.

How it sits beside the recommendation's other two settings (`bench/config.py`): `--fidelity-threshold`
is a one-batch check (the logits' cosine against fp32's from identical weights) that decides which
candidates may be recommended; `--tie-tolerance` is a throughput margin that decides among those.
The gate changes neither choice: it checks the trajectory -- drift accumulated over the training steps,
in the loss's own unit (nats for a language model) -- of every candidate, records each one's largest gap
and verdict, and makes `ampkit bench` exit with status 3 when the recommended candidate fails (CI).
fp32 is the reference: its gap is 0.
"""

from __future__ import annotations

import math
from typing import Any

from ampkit.bench.candidates import candidate_spec


def convergence_gate(reference: list, curve: list, *, gate: float, warmup: int) -> dict:
    """The convergence gate on two per-step loss curves (the same batches step for step, from the same
    weights): passed when |loss - fp32's loss| <= `gate` at every step both ran after the first `warmup`
    (the larger of the two runs' untimed warm-up steps). A non-finite loss (None in summary.json, NaN)
    is an infinite gap; no matched step after warm-up fails. Steps are 1-based, as in the loss curve."""
    n = min(len(reference), len(curve))
    gaps = [(i + 1, _gap(reference[i], curve[i])) for i in range(warmup, n)]
    worst_step, worst = max(gaps, key=lambda g: g[1], default=(None, None))
    passed = bool(gaps) and worst is not None and worst <= gate
    return {
        "gate": gate,
        "first_step": warmup + 1,
        "last_step": n,
        "steps_compared": len(gaps),
        "max_gap": worst,
        "worst_step": worst_step,
        "passed": passed,
        "reason": None if gaps else f"no matched step after warm-up (step {warmup}): raise --steps",
    }


def _gap(a: float | None, b: float | None) -> float:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b)


GATE_EXIT = 3
"""`ampkit bench --gate` exits with this status when the recommended candidate fails the gate (for CI)."""


def gate_line(name: str | None, found: dict | None) -> str | None:
    """One line on the recommended candidate's gate, or None (no gate, nothing recommended)."""
    if name is None or found is None:
        return None
    gate = found["gate"]
    if found["steps_compared"] == 0:
        return f"convergence gate {gate:g}: {name} FAILS: {found['reason']} (exit status {GATE_EXIT})"
    span = f"steps {found['first_step']}-{found['last_step']}"
    gap = found["max_gap"]
    worst = "non-finite" if not math.isfinite(gap) else f"{gap:.4g}"
    if found["passed"]:
        return f"convergence gate {gate:g}: {name} passes (max |loss gap| vs fp32 {worst} over {span})"
    return (
        f"convergence gate {gate:g}: {name} FAILS (|loss gap| vs fp32 {worst} at step {found['worst_step']}, "
        f"{span}; exit status {GATE_EXIT})"
    )


def add_gate(entries: list[dict[str, Any]], gate: float) -> None:
    """Each measured entry's `gate` block against the fp32 entry's loss curve (None: no gate, or not measured)."""
    ref = next((e for e in entries if candidate_spec(e["name"]).is_reference and e["status"] == "ok"), None)
    for entry in entries:
        entry["gate"] = None
        if not gate or ref is None or entry["status"] != "ok":
            continue
        if entry is not ref and not (entry["vs_fp32"] or {}).get("same_batches"):
            entry["gate"] = {**_unmatched(gate), "reason": "ran on other batches than fp32 (a reduced batch)"}
            continue
        warmup = max(entry["steps"]["warmup"], ref["steps"]["warmup"])
        entry["gate"] = convergence_gate(ref["loss"]["curve"], entry["loss"]["curve"], gate=gate, warmup=warmup)


def _unmatched(gate: float) -> dict[str, Any]:
    empty = {"first_step": 0, "last_step": 0, "steps_compared": 0, "max_gap": None, "worst_step": None}
    return {"gate": gate, **empty, "passed": False}


def gate_block(entries: list[dict[str, Any]], recommended: str | None, gate: float) -> dict[str, Any] | None:
    """summary.json's `gate`: the setting, the recommended candidate's verdict, each candidate's, the exit status."""
    if not gate:
        return None
    chosen = next((e["gate"] for e in entries if e["name"] == recommended), None)
    passed = None if chosen is None else chosen["passed"]
    return {
        "gate": gate,
        "recommended": recommended,
        "passed": passed,
        "exit_status": GATE_EXIT if passed is False else 0,
        "candidates": {e["name"]: e["gate"]["passed"] for e in entries if e["gate"] is not None},
        "line": gate_line(recommended, chosen),
    }
