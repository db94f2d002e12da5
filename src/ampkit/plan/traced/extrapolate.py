"""The traced ledger of a transformers model at any size: shallow traces, extrapolated to its depth.

A fake-tensor trace costs time per op, so per layer; a 70B model's 80 layers would take a minute a
configuration. Its layers are identical, though (`plan/describe/layers.py` checks), and a training step's
memory at any moment is then linear in the depth: parameters, gradients and optimizer states grow
by one layer's worth per layer; at the loss every layer's saved activations are alive; during the
backward of block k the activations of blocks 0..k and the gradients of blocks k+1..L-1 are. So
each *moment* of the step (`hf.MomentTracker`: the lines at the peak of "forward: block k",
"backward: loss", ...) is traced at depth 1 and depth 2, and its lines extrapolated to depth L:
    lines(L) = lines(1) + (L - 1) * (lines(2) - lines(1)).
Blocks are keyed by position, not index: the first and the last block of the step's backward are
two moments (the highest point over the blocks in between is reached at one of the two: their
base is linear in k); with one layer both are the same block, which is consistent. The step's peak
is the highest extrapolated moment; fit and the largest micro-batch/sequence use every moment.

Layers that differ but repeat (Gemma 2's sliding/global alternation, DeepSeek-V3's dense first layer)
are extrapolated the same way over repeats of their period (depths prefix + 1 and + 2 periods). The
assumption is checked on the model: by the layers' signatures, by the shallow copies' own layers,
and by a trace with three repeats, which must match the extrapolation (`CHECK_TOLERANCE`); any
failure traces the model in full, with the reason in the plan. Every traced setting is cached.
FSDP over N GPUs divides the traced parameters, gradients and optimizer states by N and adds two
gathered layers in the compute dtype (the analytic ledger's rule); DDP keeps the one-process ledger.
Units: bytes.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ampkit.plan.describe.hf import HFDescription
from ampkit.plan.fit import MAX_SEARCH, Fit, SearchField, fit_of, largest_affine
from ampkit.plan.numerics import get_numerics
from ampkit.plan.setting import DEFAULT_RESERVE, TENSOR_LINES, Ledger, Reserve, StepSetting
from ampkit.plan.traced.forked import run_beside
from ampkit.plan.traced.hf import CopyMismatch, MomentTracker, trace_hf_step, traced_precision

CHECK_TOLERANCE = 1e-3
"""relative gap allowed between a 3-repeat trace and the extrapolation (both are exact byte counts)"""
_BLOCK = re.compile(r"^(forward|backward): block (\d+)(.*)$")
Lines = dict[str, int]


@dataclass(frozen=True)
class Table:
    """A step's moments: each one's lines at its own peak, and each line's largest value."""

    moments: dict[str, Lines]
    largest: Lines
    labels: dict[str, str]
    """moment key -> how the moment reads in the planned model ("backward: block 79", ...)"""

    def peak(self) -> tuple[str, Lines]:
        key = max(self.moments, key=lambda k: sum(self.moments[k].values()))
        return key, self.moments[key]


class Mismatch(Exception):
    """The shallow traces do not line up (the model is then traced in full)."""


def moment_keys(label: str, *, prefix: int, period: int, repeats: int) -> list[str]:
    """The keys of a traced moment: blocks by their position in the pattern (prefix block k, the first
    or last repeat's block o, a remainder block); a middle repeat's blocks have none (dominated)."""
    match = _BLOCK.match(label)
    if match is None:
        return [label]
    phase, k, rest = match.group(1), int(match.group(2)), match.group(3)
    if k < prefix:
        return [f"{phase}: prefix block {k}{rest}"]
    q, o = divmod(k - prefix, period)
    if q >= repeats:
        return [f"{phase}: remainder block {k - prefix - repeats * period}{rest}"]
    keys = [f"{phase}: first repeat, block {o}{rest}"] if q == 0 else []
    return keys + ([f"{phase}: last repeat, block {o}{rest}"] if q == repeats - 1 else [])


def _display(key: str, *, prefix: int, period: int, repeats: int) -> str:
    match = re.match(r"^(forward|backward): (prefix|first repeat,|last repeat,|remainder) block (\d+)(.*)$", key)
    if match is None:
        return key
    phase, where, k, rest = match.group(1), match.group(2), int(match.group(3)), match.group(4)
    offset = {"prefix": 0, "first repeat,": prefix, "last repeat,": prefix + (repeats - 1) * period}
    index = offset.get(where, prefix + repeats * period) + k
    return f"{phase}: block {index}{rest}"


def table_of(tracker: MomentTracker, *, prefix: int = 0, period: int = 1, repeats: int | None = None) -> Table:
    """A tracker's moments keyed by pattern position (`repeats=None`: by label, a full trace)."""
    moments: dict[str, Lines] = {}
    for label, (_, lines) in tracker.moments.items():
        keys = [label] if repeats is None else moment_keys(label, prefix=prefix, period=period, repeats=repeats)
        for key in keys:
            moments[key] = dict(lines)
    return Table(moments=moments, largest=dict(tracker.largest), labels={k: k for k in moments})


def extrapolate(one: Table, two: Table, repeats: int, *, prefix: int, period: int) -> Table:
    """Tables traced with 1 and 2 repeats of the period -> the table with `repeats` repeats."""
    if set(one.moments) != set(two.moments):
        raise Mismatch(f"moments differ between the shallow traces: {sorted(set(one.moments) ^ set(two.moments))}")

    def line(a: int, b: int) -> int:
        return max(0, a + (repeats - 1) * (b - a))

    moments = {k: {n: line(one.moments[k][n], two.moments[k][n]) for n in TENSOR_LINES} for k in one.moments}
    largest = {n: line(one.largest[n], two.largest[n]) for n in TENSOR_LINES}
    labels = {k: _display(k, prefix=prefix, period=period, repeats=repeats) for k in moments}
    return Table(moments=moments, largest=largest, labels=labels)


def agrees(predicted: Table, traced: Table) -> bool:
    """The extrapolated peak (total and lines) matches a trace of the same depth."""
    _, want = traced.peak()
    _, got = predicted.peak()
    total = sum(want.values())
    return all(abs(got[n] - want[n]) <= CHECK_TOLERANCE * total for n in TENSOR_LINES)


def shard(lines: Lines, desc: HFDescription, setting: StepSetting) -> Lines:
    """One process's lines under FSDP over `setting.shards` GPUs, from the one-process trace."""
    if setting.shards == 1:
        return dict(lines)
    out = dict(lines)
    for name in ("parameters", "gradients", "optimizer_states", "master_weights"):
        out[name] = lines[name] // setting.shards
    out["weight_copies"] = 0  # MixedPrecisionPolicy gathers low-precision layers instead of autocast's copies
    out["temporaries"] += 2 * get_numerics(setting.precision).compute_bytes * desc.block_parameters()
    return out


def memory_class(precision: str) -> tuple:
    """Precisions whose steps allocate the same bytes share a trace: fp32 and tf32 (TF32 is a math
    mode), fp16 and bf16 in the same regime (2-byte types; the loss scaler adds a few scalars),
    fp8 and its emulation (`hf.traced_precision`)."""
    num = get_numerics(traced_precision(precision))
    return (num.param_bytes, num.compute_bytes, num.autocast, num.float8_block_linears)


CHECK_COST = 1.0
"""the first setting's extra work, in units of its `trace_cost`: the 3-repeat check's trace plus this
process's first-trace warm-up (measured on a Llama-shaped model: about as much as its 1- and 2-repeat
traces together)"""


def trace_cost(setting: StepSetting) -> float:
    """A setting's shallow traces' relative CPU time: measured on a Llama-shaped model, float8 Linears
    ~2.1x the others; checkpointing changes it by under 10%."""
    return 2.1 if _float8(setting) else 1.0


def _float8(setting: StepSetting) -> bool:
    return get_numerics(traced_precision(setting.precision)).float8_block_linears


def _split(settings: list[StepSetting], *, first_extra: float) -> tuple[list[StepSetting], list[StepSetting]]:
    """(this process's, the child's): the first setting here, then the rest in groups that share their
    first trace's warm-up (the float8 ones, ~0.1 s of imports and caches), costliest first, each to
    the less loaded side."""
    first, rest = settings[0], settings[1:]
    groups = [[s for s in rest if _float8(s)]] + [[s] for s in rest if not _float8(s)]
    sides: tuple[list[StepSetting], list[StepSetting]] = ([first], [])
    load = [trace_cost(first) * (1 + first_extra), 0.0]
    for group in sorted((g for g in groups if g), key=lambda g: sum(map(trace_cost, g)), reverse=True):
        side = 0 if load[0] <= load[1] else 1
        sides[side].extend(group)
        load[side] += sum(map(trace_cost, group))
    return sides


class HFTracedEngine:
    """The traced ledger of an `HFDescription` for any setting (cached), extrapolated where the
    layers allow it; `note` says how it was obtained."""

    name = "traced"

    def __init__(self, desc: HFDescription, *, reserve: Reserve = DEFAULT_RESERVE):
        self.desc, self.reserve = desc, reserve
        self._tables: dict[tuple, Table] = {}
        pattern = desc.pattern
        self.extrapolating: bool | None = None if pattern.extrapolable else False
        self.reason = "" if pattern.extrapolable else f"{pattern.describe()}: traced in full"

    # -- traces ------------------------------------------------------------------------------
    @staticmethod
    def _key(setting: StepSetting) -> tuple:
        return (
            memory_class(setting.precision),
            setting.optimizer,
            setting.checkpointing,
            setting.micro_batch,
            setting.seq_len,
            setting.grad_accum > 1,
        )

    def _trace(self, setting: StepSetting, repeats: int) -> Table:
        p = self.desc.pattern
        tracker = trace_hf_step(self.desc, setting, depth=p.depth(repeats))
        return table_of(tracker, prefix=p.prefix, period=p.period, repeats=repeats)

    def _extrapolated(self, setting: StepSetting) -> Table:
        p = self.desc.pattern
        one, two = self._trace(setting, 1), self._trace(setting, 2)
        table = extrapolate(one, two, p.repeats, prefix=p.prefix, period=p.period)
        if self.extrapolating is None:  # the first setting checks the assumption once for all
            three = self._trace(setting, 3)
            if not agrees(extrapolate(one, two, 3, prefix=p.prefix, period=p.period), three):
                raise Mismatch("a trace with 3 repeats of the layers does not match the extrapolation")
            self.extrapolating = True
            self.reason = f"{p.describe()}: extrapolated from traces of {p.depth(1)} and {p.depth(2)} layers"
        return table

    def table(self, setting: StepSetting) -> Table:
        """The one-process table of `setting` (world size and parallel mode do not change it)."""
        key = self._key(setting)
        if key not in self._tables:
            self._tables[key] = self._compute(setting)
        return self._tables[key]

    def _compute(self, setting: StepSetting) -> Table:
        if self.extrapolating is not False:
            try:
                return self._extrapolated(setting)
            except (Mismatch, CopyMismatch) as err:
                self.extrapolating = False
                self.reason = f"{self.desc.pattern.describe()}, but {err}: traced in full"
                self._tables.clear()
        return table_of(trace_hf_step(self.desc, setting, depth=self.desc.n_layers))

    @property
    def note(self) -> str:
        return self.reason or "traced"

    def prefetch(self, settings: Iterable[StepSetting]) -> None:
        """Trace the tables `settings` need before they are asked for, in two processes where
        `plan/traced/forked.py` offers a second: the first setting here (it checks the extrapolation, as it
        would first in order), the others split by `trace_cost`. The child's tables are kept only if
        the check passed here; whatever it did not deliver is traced here when asked for. Every
        table is the one `table(setting)` traces (a trace depends on its setting only)."""
        todo: dict[tuple, StepSetting] = {}
        for setting in settings:  # each table traced with its first setting, as the rows ask for it
            if self.desc.max_positions and setting.seq_len > self.desc.max_positions:
                return  # `ledger` refuses this setting before tracing anything: leave it to the rows
            if self._key(setting) not in self._tables:
                todo.setdefault(self._key(setting), setting)
        if self.extrapolating is False or len(todo) < 2:
            return
        mine, theirs = _split(list(todo.values()), first_extra=CHECK_COST)
        tables = run_beside(lambda: self._child_tables(theirs), lambda: [self.table(s) for s in mine])
        if self.extrapolating and isinstance(tables, dict):
            for key, table in tables.items():
                self._tables.setdefault(key, table)

    def _child_tables(self, settings: list[StepSetting]) -> dict[tuple, Table]:
        """In the forked child: the extrapolated tables of `settings` (the parent checks the
        assumption); it stops at a mismatch, which the parent then meets, and reports, itself."""
        self.extrapolating = True
        out: dict[tuple, Table] = {}
        for setting in settings:
            try:
                out[self._key(setting)] = self._extrapolated(setting)
            except (Mismatch, CopyMismatch):
                break
        return out

    # -- ledgers and fits ----------------------------------------------------------------------
    def moments(self, setting: StepSetting) -> dict[str, Lines]:
        table = self.table(setting)
        return {k: shard(v, self.desc, setting) for k, v in table.moments.items()}

    def ledger(self, setting: StepSetting) -> Ledger:
        self._check_positions(setting)
        table = self.table(setting)
        moments = self.moments(setting)
        key = max(moments, key=lambda k: sum(moments[k].values()))
        largest = shard(table.largest, self.desc, setting)
        return Ledger.of_peak(
            setting, "traced", lines=moments[key], largest=largest, moment=table.labels[key], reserve=self.reserve
        )

    def _check_positions(self, setting: StepSetting) -> None:
        from ampkit.errors import UsageError

        limit = self.desc.max_positions
        if limit and setting.seq_len > limit:
            raise UsageError(
                f"--seq-len {setting.seq_len} exceeds {self.desc.name}'s {limit} positions "
                "(max_position_embeddings, which ampkit train enforces); use a shorter --seq-len"
            )

    def _totals(self, setting: StepSetting) -> dict[str, int]:
        return {k: sum(v.values()) for k, v in self.moments(setting).items()}

    def largest(
        self,
        setting: StepSetting,
        capacity: int,
        *,
        field: SearchField,
        limit: int = MAX_SEARCH,
    ) -> int:
        """Largest micro-batch (affine in it) or sequence (quadratic: attention scores) that fits with
        the engine's reserve."""
        budget = self.reserve.tensor_budget(capacity)
        if field == "micro_batch":
            return self._largest_batch(setting, budget, limit)
        return self._largest_seq(setting, budget, min(limit, self.desc.max_positions or limit))

    def _largest_batch(self, setting: StepSetting, budget: float, limit: int) -> int:
        at1, at2 = self._totals(replace(setting, micro_batch=1)), self._totals(replace(setting, micro_batch=2))
        return largest_affine(((at1[key], at2[key]) for key in at1.keys() & at2.keys()), budget, limit)

    def _largest_seq(self, setting: StepSetting, budget: float, limit: int) -> int:
        """Every moment is a quadratic in the sequence length (fake tensors' sizes are exact
        polynomials: activations linear, eager attention scores quadratic): three traced lengths
        give each moment's quadratic, solved exactly."""
        s = setting.seq_len
        points = sorted({max(1, s // 4), max(2, s // 2), max(3, s)})
        tables = [self._totals(replace(setting, seq_len=t)) for t in points]
        best = float(limit)
        for key in set.intersection(*(set(t) for t in tables)):
            best = min(best, _quadratic_root([t[key] for t in tables], points, budget))
        return max(0, int(min(best, limit)))

    def fit(self, setting: StepSetting, total_bytes: int, capacity: int) -> Fit:
        return fit_of(total_bytes, capacity, functools.partial(self.largest, setting, capacity))


def _quadratic_root(values: list[int], points: list[int], budget: float) -> float:
    """The largest x with a + b x + c x^2 <= budget, for the quadratic through (points, values)."""
    (x0, x1, x2), (y0, y1, y2) = points, values
    c = ((y2 - y0) / (x2 - x0) - (y1 - y0) / (x1 - x0)) / (x2 - x1)
    b = (y1 - y0) / (x1 - x0) - c * (x0 + x1)
    a = y0 - b * x0 - c * x0 * x0
    if a > budget:
        return 0.0
    if c <= 1e-12 * max(1.0, abs(b)):
        return math.inf if b <= 0 else (budget - a) / b
    return (-b + math.sqrt(b * b - 4 * c * (a - budget))) / (2 * c)
