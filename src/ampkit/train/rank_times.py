"""Per-rank step times of a data-parallel run and each rank's straggler score (summary.json's "ranks").

Each rank times its own steps (`loop.ThroughputWindow`: the mean step time of each log window; on
the CPU a window is one step, on an accelerator `--log-every`, 10 by default, because a timing read
is a device sync). The times are gathered to every rank once, at the end of a run that completed or
stopped (one `all_gather_object`: the only sync point this adds; a failed or diverged run skips it,
its ranks may not all get here). A rank's straggler score is its median over the fastest rank's
median: 1.00 is the fastest rank, 1.25 a rank a quarter slower.

What the times include: everything between two log steps on that rank, waits at collectives too. In
synchronous DDP/FSDP2 every rank waits for the slowest at each gradient sync, so a rank slow in its
forward/backward drags every rank's time up and the scores stay near 1.00; they part where a rank
is slow outside the syncs (its data, its optimizer step, host work, rank 0's logging and writes).
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampkit.core.parallel import LocalRun

P90 = 0.9


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (`q` in 0..1): the smallest value with at least q of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def own_step_times(step_s: list[float]) -> dict[str, Any]:
    """This rank's measured windows (seconds per step, warm-up windows already dropped) in ms."""
    if not step_s:
        return {"windows": 0, "step_ms_median": None, "step_ms_p90": None}
    ms = [1000.0 * s for s in step_s]
    return {"windows": len(ms), "step_ms_median": statistics.median(ms), "step_ms_p90": percentile(ms, P90)}


def straggler_scores(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`per_rank` (in rank order) with each rank's number and straggler score (None without a median)."""
    medians = [r["step_ms_median"] for r in per_rank if r["step_ms_median"]]
    fastest = min(medians) if medians else None
    return [
        {
            "rank": rank,
            **times,
            "straggler": times["step_ms_median"] / fastest if fastest and times["step_ms_median"] else None,
        }
        for rank, times in enumerate(per_rank)
    ]


def gather_rank_times(parallel: LocalRun, step_s: list[float], *, agreed: bool) -> list[dict[str, Any]] | None:
    """Every rank's step times and straggler score (a collective: every rank calls it with the same
    `agreed`, True when the run completed or stopped); None for one process or a run that did not."""
    if not parallel.distributed or not agreed:
        return None
    return straggler_scores(parallel.all_gather_object(own_step_times(step_s)))  # sync point: once, at the end
