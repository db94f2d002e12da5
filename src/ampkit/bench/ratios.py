"""Ratios against fp32 that agree with the figures printed beside them.

- **The speedup vs fp32** (`matched_speedup`): items/s over the measured steps both precisions ran -- the
  same batches, step for step -- less the leading steps of either run that were still warming up
  (`warmup_like_steps`). When no step is left to match (a slow precision measured 3 steps, all while fp32
  was still warming up) it is the ratio of the two precisions' items/s figures. Either way it records that
  ratio of the figures (`items_per_s_ratio`) and whether the speedup agrees with it within `AGREEMENT`;
  one that does not carries a footnote saying which steps it compares (`speedup_note`).
- **The matmul ratio behind Amdahl's prediction** (`profile_ratios`): fp32's matmul/attention time in its
  profiled step over this precision's, per padded slot -- this model's matmuls at its shapes, not the
  large-GEMM probe of `bench.peaks` (which plans the budget only: an emulated dtype can be 100x slower on a
  4096-wide GEMM and 3x slower on a small model's). A measured speedup above what Amdahl's law gives from it
  says why (`amdahl_note`).
Units: seconds per step inside; a ratio is this precision's speed over fp32's (2.0: twice as fast).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ampkit.bench.recommend import format_speedup
from ampkit.bench.timing import summarize_steps

WARMUP_FACTOR = 1.25
"""a leading measured step slower than this many times its run's median time per padded slot is still
warming up (allocator, caches, thread pools; 368/592/327 ms against a 203 ms median on a loaded host): the
matched-step speedup leaves it out"""
AGREEMENT = 0.10
"""a speedup within this relative distance of the ratio of the two items/s figures printed beside it
agrees with them (the console shows 2 significant digits); further apart it carries a footnote"""


def warmup_like_steps(step_s: list[float], slots: list[int]) -> int:
    """How many of the first measured steps are still warming up: each slower than WARMUP_FACTOR x the
    run's median seconds per padded slot (per slot: a longer batch is not a warm-up)."""
    if len(step_s) < 2:
        return 0
    per_slot = [s / max(1, n) for s, n in zip(step_s, slots)]
    limit = WARMUP_FACTOR * statistics.median(per_slot)
    count = 0
    for value in per_slot:
        if value <= limit:
            break
        count += 1
    return count


@dataclass(frozen=True, kw_only=True)
class Speedup:
    """One precision's items/s over fp32's, and what it was taken over."""

    speedup: float
    steps_compared: int
    """matched measured steps (0: the ratio of the items/s figures, nothing left to match)"""
    first_step: int
    """the first matched measured step, counted from 1 (0 when none)"""
    warmup_like: tuple[int, ...]
    """(this precision's, fp32's) leading warm-up-like steps, left out of the match"""
    items_per_s_ratio: float
    """the ratio of the two items/s figures (every measured step of each, stalls excluded)"""

    @property
    def agrees(self) -> bool:
        return abs(self.speedup / self.items_per_s_ratio - 1.0) <= AGREEMENT if self.items_per_s_ratio else True

    def to_dict(self) -> dict[str, Any]:
        return {
            "speedup": self.speedup,
            "steps_compared": self.steps_compared,
            "first_step_compared": self.first_step,
            "warmup_like_steps": {"this": self.warmup_like[0], "reference": self.warmup_like[1]},
            "items_per_s_ratio": self.items_per_s_ratio,
            "agrees": self.agrees,
        }


def _items_per_s(result: dict[str, Any], start: int = 0, stop: int | None = None) -> float:
    window = slice(start, stop)
    return summarize_steps(result["step_s"][window], result["tokens"][window], result["slots"][window]).items_per_s


def matched_speedup(result: dict[str, Any], reference: dict[str, Any]) -> Speedup:
    """The speedup over the measured steps both ran on the same batches, after either run's warm-up-like
    leading steps; the ratio of the items/s figures when none is left (workers' raw `step_s`, `tokens`,
    `slots`)."""
    figures = _items_per_s(result) / _items_per_s(reference)
    warm = tuple(warmup_like_steps(run["step_s"], run["slots"]) for run in (result, reference))
    start, stop = max(warm), min(len(result["step_s"]), len(reference["step_s"]))
    if stop <= start:
        return Speedup(speedup=figures, steps_compared=0, first_step=0, warmup_like=warm, items_per_s_ratio=figures)
    speedup = _items_per_s(result, start, stop) / _items_per_s(reference, start, stop)
    return Speedup(
        speedup=speedup, steps_compared=stop - start, first_step=start + 1, warmup_like=warm, items_per_s_ratio=figures
    )


def speedup_note(vs_fp32: dict[str, Any] | None, *, unit: str) -> str | None:
    """What a speedup that disagrees with the items/s figures beside it compares, or None when it agrees
    (or was written before `agrees` existed)."""
    if not vs_fp32 or vs_fp32.get("agrees", True):
        return None
    first, steps = vs_fp32["first_step_compared"], vs_fp32["steps_compared"]
    skipped = max((vs_fp32.get("warmup_like_steps") or {}).values(), default=0)
    warm = f", after {skipped} warm-up-like step{'s' if skipped != 1 else ''}" if skipped else ""
    return (
        f"vs fp32 is {format_speedup(vs_fp32['speedup'])} over measured steps {first}-{first + steps - 1}, which both "
        f"ran on the same batches{warm}; over all their measured steps the {unit}/s figures give "
        f"{format_speedup(vs_fp32['items_per_s_ratio'])}"
    )


def _per_slot(profile: dict[str, Any], ms: float) -> float:
    slots = profile.get("slots")
    return ms / slots if slots else ms


def profile_ratios(profile: dict[str, Any], reference: dict[str, Any]) -> dict[str, float | None]:
    """From two profiled steps (`bench.profile` breakdowns, with their padded `slots` where known): fp32's
    matmul/attention ms over this one's (`matmul_ratio`), the same for the rest of the step (`rest_ratio`)
    and for the whole step (`profiled_speedup`), all per padded slot when both know their slots."""
    both = bool(profile.get("slots") and reference.get("slots"))
    mine, ref = (profile if both else {**profile, "slots": None}), (reference if both else {**reference, "slots": None})

    def ratio(ref_ms: float, my_ms: float) -> float | None:
        return _per_slot(ref, ref_ms) / _per_slot(mine, my_ms) if my_ms > 0 and ref_ms > 0 else None

    ref_matmul, my_matmul = reference["ms"].get("matmul", 0.0), profile["ms"].get("matmul", 0.0)
    return {
        "matmul_ratio": ratio(ref_matmul, my_matmul),
        "rest_ratio": ratio(reference["step_ms"] - ref_matmul, profile["step_ms"] - my_matmul),
        "profiled_speedup": ratio(reference["step_ms"], profile["step_ms"]),
    }


def amdahl_note(measured: float, profile: dict[str, Any]) -> str | None:
    """Why a measured speedup is above what Amdahl's law gives from the matmul ratio (None: it is not)."""
    predicted = profile.get("amdahl_speedup")
    if not predicted or measured <= predicted * (1.0 + AGREEMENT):
        return None
    if profile.get("matmul_ratio_source") is None:  # a summary written before: the large-GEMM probe's ratio
        return "that ratio is a large-matmul probe's, not this model's matmuls"
    rest = profile.get("rest_ratio")
    if rest and rest > 1.0 + AGREEMENT:
        return f"it measured above that because the rest of its step ran at {format_speedup(rest)} fp32's speed too"
    whole = profile.get("profiled_speedup")
    where = f" (the profiled step itself: {format_speedup(whole)})" if whole else ""
    return f"it measured above that: its measured steps ran faster than its profiled warmup step{where}"
