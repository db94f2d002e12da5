"""Fit a step on a GPU: does it fit, with what headroom, and the largest micro-batch or sequence.

Capacity: `--gpu NAME` takes the nominal memory of `ampkit.hardware.GPUS` (the vendors' data
sheets; read as GiB) less 1% that the driver and ECC keep (torch reports A100-80GB as ~79.3 GiB);
`--gpu-mem 24GiB` is taken as given.
A step fits when its ledger total (tensor peak + framework reserve) is at most the capacity.

Largest micro-batch / sequence: every allocation in the analytic replay is affine in the number of
tokens (flash attention keeps no T x T matrix), so the total after each allocation is A_i + B_i * x
for x = micro-batch (or sequence length). Two replays give every (A_i, B_i); the largest x with
(1 + fragmentation) * max_i(A_i + B_i x) + context <= capacity is then solved exactly, and checked.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

from ampkit.errors import UsageError
from ampkit.hardware import GpuSpec, lookup_gpu
from ampkit.plan.analytic.ledger import StepReplay, analytic_ledger
from ampkit.plan.describe import ModelDescription
from ampkit.plan.setting import DEFAULT_RESERVE, GIB, Reserve, StepSetting

DRIVER_RESERVED = 0.01  # fraction of nominal memory the driver / ECC keep from PyTorch
MAX_SEARCH = 1 << 24  # upper bound for micro-batch / sequence searches

_UNITS = {
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": GIB,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}


def parse_memory(text: str) -> int:
    """'24GiB', '80 GB', '81920MiB' -> bytes. GiB = 1024**3, GB = 1000**3; a bare number is GiB."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = (match.group(2) or "GiB").lower() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(f"cannot read memory size {text!r}; write e.g. 24GiB, 80GB or 16384MiB")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise UsageError(f"memory size must be positive, got {text!r}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class Target:
    """The memory a plan must fit in."""

    name: str
    capacity_bytes: int
    gpu: GpuSpec | None
    """the table entry when the target is a named GPU (peaks for the compute estimate)"""

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "capacity_bytes": self.capacity_bytes,
            "capacity_gib": round(self.capacity_bytes / GIB, 2),
            "gpu": self.gpu.name if self.gpu else None,
        }


def resolve_target(gpu: str | None, gpu_mem: str | None) -> Target | None:
    """`--gpu` and/or `--gpu-mem` -> a Target (memory from --gpu-mem when both are given)."""
    spec = _lookup(gpu) if gpu else None
    if gpu_mem:
        capacity = parse_memory(gpu_mem)
        return Target(name=spec.name if spec else gpu_mem.strip(), capacity_bytes=capacity, gpu=spec)
    if spec is None:
        return None
    return Target(name=spec.name, capacity_bytes=int(spec.memory_bytes * (1 - DRIVER_RESERVED)), gpu=spec)


def _lookup(name: str) -> GpuSpec:
    """The table row (an ambiguous family, e.g. "A100", is refused listing its variants)."""
    return lookup_gpu(name, unknown_hint="'--gpu list' prints the table; or give --gpu-mem 24GiB for any card")


@dataclass(frozen=True, kw_only=True)
class Fit:
    fits: bool
    headroom_bytes: int
    """capacity minus the ledger total (negative: short by that much)"""
    max_micro_batch: int
    """largest micro-batch that fits at this sequence length (0: not even 1)"""
    max_seq_len: int
    """largest sequence that fits at this micro-batch (0: not even 1 token)"""

    def to_dict(self) -> dict:
        return {
            "fits": self.fits,
            "headroom_bytes": self.headroom_bytes,
            "headroom_gib": round(self.headroom_bytes / GIB, 3),
            "max_micro_batch": self.max_micro_batch,
            "max_seq_len": self.max_seq_len,
        }


def largest_affine(totals: Iterable[tuple[int, int]], budget: float, limit: int) -> int:
    """The largest x <= `limit` (0: none) at which every total, affine in x and given as its values at
    x = 1 and x = 2, stays within `budget`: a total that does not grow with x only has to fit."""
    best = limit
    for at1, at2 in totals:
        slope, intercept = at2 - at1, 2 * at1 - at2
        if slope <= 0:
            if intercept > budget:
                return 0
            continue
        best = min(best, math.floor((budget - intercept) / slope))
    return max(0, best)


def _totals(desc: ModelDescription, setting: StepSetting) -> list[int]:
    replay = StepReplay(desc, setting)
    replay.replay.totals = []
    replay.run()
    return replay.replay.totals


SearchField = Literal["micro_batch", "seq_len"]


def _with(setting: StepSetting, field: SearchField, value: int) -> StepSetting:
    """`setting` with its micro-batch or its sequence length set to `value`."""
    if field == "micro_batch":
        return replace(setting, micro_batch=value)
    return replace(setting, seq_len=value)


def largest(
    desc: ModelDescription,
    setting: StepSetting,
    capacity: int,
    *,
    field: SearchField,
    reserve: Reserve = DEFAULT_RESERVE,
    limit: int = MAX_SEARCH,
) -> int:
    """Largest `field` ("micro_batch" or "seq_len") that fits, all else as in `setting` (0: none)."""
    at1, at2 = _totals(desc, _with(setting, field, 1)), _totals(desc, _with(setting, field, 2))
    best = largest_affine(zip(at1, at2), reserve.tensor_budget(capacity), limit)

    def fits(value: int) -> bool:
        return analytic_ledger(desc, _with(setting, field, value), reserve=reserve).total <= capacity

    # the replay rounds each allocation to whole bytes: confirm, and step down if a rounding bit
    while best > 0 and not fits(best):
        best -= 1
    if best == 0 or best >= limit or not fits(best + 1):
        return best
    # A total may grow slower than its line through x = 1 and 2 (the loss's fp32 chunk stops growing once
    # it holds a chunk's rows: models/loss.py), so the boundary lies above: double, then bisect.
    low, high = best + 1, min(limit, 2 * best + 2)
    while high < limit and fits(high):
        low, high = high, min(limit, 2 * high)
    if fits(high):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def fit_of(total_bytes: int, capacity: int, search: Callable[..., int], *, seq_limit: int = MAX_SEARCH) -> Fit:
    """The `Fit` of a step of `total_bytes` in `capacity`, with `search(field=..., limit=...)` an engine's
    largest micro-batch / sequence search (each with the other as in the step's setting)."""
    return Fit(
        fits=total_bytes <= capacity,
        headroom_bytes=capacity - total_bytes,
        max_micro_batch=search(field="micro_batch", limit=MAX_SEARCH),
        max_seq_len=search(field="seq_len", limit=seq_limit),
    )


def fit(
    desc: ModelDescription, setting: StepSetting, total_bytes: int, capacity: int, *, reserve: Reserve = DEFAULT_RESERVE
) -> Fit:
    """Whether a step of `total_bytes` fits `capacity`, by how much, and the largest micro-batch and
    sequence (each with the other as in `setting`) that fit."""
    search = functools.partial(largest, desc, setting, capacity, reserve=reserve)
    return fit_of(total_bytes, capacity, search, seq_limit=desc.max_positions or MAX_SEARCH)
