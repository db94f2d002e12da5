"""Step timing that tells the truth on CPU and accelerators, and the statistics bench reports from it.

Hazards handled here:
- Accelerator kernels run asynchronously: the host clock measures launches, not work. On CUDA, ROCm,
  XPU and MPS each step is bracketed by timing events (`torch.Event`) recorded on the stream; they are
  read once, after one final synchronize, so timing adds no sync points to the loop
  (`hardware.backend.EventStepTimer`).
- A shared host can stall a process for a long time (seconds, on a busy VM) in the middle of a
  50 ms step. Such steps say nothing about the precision; `summarize_steps` flags them as stalls
  and reports tokens/s both without and with them.
Units: seconds inside, milliseconds in names that say `_ms`.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from ampkit.hardware.backend import EventStepTimer, HostStepTimer, backend_for

STALL_FACTOR = 4.0
"""A step is a stall when it took more than this many times the median step time *and* the median
time per padded slot (both: a legitimately long batch is longer per step, not per slot)."""


def make_step_timer(device: torch.device) -> HostStepTimer | EventStepTimer:
    """The device's step timer (`hardware.backend`): host clock on CPU, timing events on an accelerator."""
    return backend_for(device).step_timer()


def synchronize(device: torch.device) -> None:
    backend_for(device).synchronize()  # sync point on an accelerator: window edges only


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """What bench reports about one precision's measured steps."""

    measured_steps: int
    stalled_steps: int
    """steps excluded from `items_per_s` as interference (see STALL_FACTOR)"""
    measured_s: float
    """sum of all measured step times, stalls included"""
    items_per_s: float
    """real (non-padding) tokens per second over the measured steps, stalls excluded: the headline"""
    items_per_s_all: float
    """the same with stalls included"""
    step_ms_median: float
    step_ms_p10: float
    step_ms_p90: float
    step_ms_min: float
    step_ms_max: float


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty list."""
    pos = q * (len(sorted_values) - 1)
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def stalled_mask(step_s: list[float], slots: list[int]) -> list[bool]:
    """True for steps slower than STALL_FACTOR x the median both per step and per padded slot."""
    median_s = statistics.median(step_s)
    per_slot = [s / max(1, n) for s, n in zip(step_s, slots)]
    median_per_slot = statistics.median(per_slot)
    return [s > STALL_FACTOR * median_s and p > STALL_FACTOR * median_per_slot for s, p in zip(step_s, per_slot)]


def summarize_steps(step_s: list[float], tokens: list[int], slots: list[int]) -> StepStats:
    """Statistics over measured steps: `step_s` seconds, `tokens` real tokens, `slots` padded slots."""
    if not step_s:
        raise ValueError("summarize_steps needs at least one measured step")
    stalls = stalled_mask(step_s, slots)
    kept = [(s, t) for s, t, bad in zip(step_s, tokens, stalls) if not bad]
    ordered = sorted(step_s)
    return StepStats(
        measured_steps=len(step_s),
        stalled_steps=sum(stalls),
        measured_s=sum(step_s),
        items_per_s=sum(t for _, t in kept) / max(sum(s for s, _ in kept), 1e-12),
        items_per_s_all=sum(tokens) / max(sum(step_s), 1e-12),
        step_ms_median=1000.0 * statistics.median(step_s),
        step_ms_p10=1000.0 * _quantile(ordered, 0.10),
        step_ms_p90=1000.0 * _quantile(ordered, 0.90),
        step_ms_min=1000.0 * ordered[0],
        step_ms_max=1000.0 * ordered[-1],
    )


def process_age_s() -> float:
    """Seconds since this process started (Linux: /proc/self/stat's start time against /proc/uptime,
    10 ms ticks); 0.0 where unreadable. `ampkit bench` counts its wall time from there, its interpreter
    and imports (~1.5 s: torch) included, as a user's clock does."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22 of stat(5), counted after the command name
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
