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
failure traces the model in full, with the reason in the plan. Every table is kept for the plan,
and every traced step (`steps.py`) is traced once: settings that allocate the same tensors share it
(`sharing.py`), the disk cache keeps it for later plans (`cache.py`), and `prefetch` spreads the
steps a plan needs, its fits' included, over two processes (`forked.py`).
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
from ampkit.plan.optim import optimizer_state_bytes
from ampkit.plan.setting import DEFAULT_RESERVE, TENSOR_LINES, Ledger, Reserve, StepSetting
from ampkit.plan.traced.cache import TraceCache
from ampkit.plan.traced.hf import CopyMismatch, MomentTracker
from ampkit.plan.traced.sequence import SequenceModel
from ampkit.plan.traced.sharing import StepTrace, memory_class, scales_loss
from ampkit.plan.traced.steps import StepTraces

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


def table_of(
    trace: StepTrace | MomentTracker, *, prefix: int = 0, period: int = 1, repeats: int | None = None
) -> Table:
    """A traced step's moments keyed by pattern position (`repeats=None`: by label, a full trace)."""
    if isinstance(trace, MomentTracker):
        trace = trace.trace()
    moments: dict[str, Lines] = {}
    for label, lines in trace.moments.items():
        keys = [label] if repeats is None else moment_keys(label, prefix=prefix, period=period, repeats=repeats)
        for key in keys:
            moments[key] = dict(lines)
    return Table(moments=moments, largest=dict(trace.largest), labels={k: k for k in moments})


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


def fit_settings(setting: StepSetting) -> list[StepSetting]:
    """The settings whose tables the largest micro-batch of `setting` reads: micro-batch 1 and 2 (the
    totals are affine in it); the largest sequence reads them too (`SequenceModel`)."""
    return [replace(setting, micro_batch=m) for m in (1, 2)]


class HFTracedEngine:
    """The traced ledger of an `HFDescription` for any setting (cached), extrapolated where the
    layers allow it; `note` says how it was obtained. `cache`: the disk cache of traced steps
    (`cache.py`; None: traced in this process only)."""

    name = "traced"

    def __init__(self, desc: HFDescription, *, reserve: Reserve = DEFAULT_RESERVE, cache: TraceCache | None = None):
        self.desc, self.reserve = desc, reserve
        self.steps = StepTraces(desc, cache=cache)
        self._tables: dict[tuple, Table] = {}
        self.sequences = SequenceModel(self)
        pattern = desc.pattern
        self.extrapolating: bool | None = None if pattern.extrapolable else False
        self.reason = "" if pattern.extrapolable else f"{pattern.describe()}: traced in full"

    # -- traces ------------------------------------------------------------------------------
    @staticmethod
    def _key(setting: StepSetting) -> tuple:
        return (
            memory_class(setting.precision),
            scales_loss(setting.precision),  # the shared trace plus the scaler's own tensors
            setting.optimizer,
            setting.checkpointing,
            setting.micro_batch,
            setting.seq_len,
            setting.grad_accum > 1,
        )

    def _trace(self, setting: StepSetting, repeats: int) -> Table:
        p = self.desc.pattern
        trace = self.steps.get(setting, p.depth(repeats))
        return table_of(trace, prefix=p.prefix, period=p.period, repeats=repeats)

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
        return table_of(self.steps.get(setting, self.desc.n_layers))

    @property
    def note(self) -> str:
        return self.reason or "traced"

    def prefetch(
        self, settings: Iterable[StepSetting], *, capacity: int | None = None, extra: Iterable[StepSetting] = ()
    ) -> None:
        """Trace the steps `settings` need before they are asked for (`capacity`: the GPU's bytes, when
        their fits are asked for too: the steps of their largest micro-batch and sequence, `fit_settings`,
        and the sequence model's check, which may ask for three lengths a setting when it fails;
        `extra`: other settings' own), in two processes where `forked.py` offers a second
        (`StepTraces.split`): the first setting here (it checks the extrapolation, as it would first in
        order), the other steps split by `trace_cost`. A setting whose weights, gradients and optimizer
        states alone surely exceed the GPU (`weights_floor`) gets no fit steps: its fits are 0 from its
        own step (`largest`). Every table is the one `table(setting)` computes (a trace depends on its
        setting and depth only), so what is prefetched decides when a step is traced, never a number."""
        wanted, more = list(settings), list(extra)
        if wanted:
            self.sequences.pin(wanted[0])
        limit = self.desc.max_positions
        if not wanted or self.extrapolating is False or (limit and any(s.seq_len > limit for s in wanted + more)):
            return  # full traces, or a setting `ledger` refuses before tracing anything: leave them to the rows
        searched = [] if capacity is None else [s for s in wanted if not self._surely_unfit(s, capacity)]
        fit_needs = [v for s in searched for v in fit_settings(s)]
        if searched:  # the sequence model's check, on the first setting whatever its own fit
            fit_needs += fit_settings(wanted[0]) + self.sequences.check_settings(wanted[0])
        if (
            searched and getattr(self.desc.hf_config, "_attn_implementation", None) == "eager"
        ):  # T x T scores: the check will fail
            fit_needs += [v for s in searched for v in self.sequences.far_settings(s)]  # one split, not two
        self._split(wanted, wanted + fit_needs + more)
        if searched and not self.sequences.linear(wanted[0]):  # memory quadratic in the sequence: a length more
            self._split(wanted, [v for s in searched for v in self.sequences.quadratic_settings(s)])

    def weights_floor(self, setting: StepSetting) -> int:
        """Bytes of one process's parameters, gradients and optimizer states under `setting`, from the
        model's description: all alive at the optimizer step whatever the micro-batch and sequence (a
        guess of the traced figure, used only to choose what to trace early)."""
        tensors = self.desc.parameter_tensors()
        param_bytes = get_numerics(setting.precision).param_bytes
        states = optimizer_state_bytes(setting.optimizer, tensors, param_bytes=param_bytes)
        return (2 * param_bytes * sum(tensors) + states) // setting.shards

    def _surely_unfit(self, setting: StepSetting, capacity: int) -> bool:
        return self.weights_floor(setting) > self.reserve.tensor_budget(capacity)

    def _split(self, wanted: list[StepSetting], needed: list[StepSetting]) -> None:
        p = self.desc.pattern
        depths = (p.depth(1), p.depth(2))

        def here(mine: list[StepSetting]) -> None:
            self.table(wanted[0])
            for setting in mine:
                if not self.extrapolating:  # the check failed: the shallow traces are not needed
                    return
                for depth in depths:
                    self.steps.get(setting, depth)

        self.steps.split(needed, depths, here)

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

    def totals(self, setting: StepSetting) -> dict[str, int]:
        """Each moment's total, in bytes, of one process (sharded as `setting` says)."""
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
        at1 = self.totals(replace(setting, micro_batch=1))
        if max(at1.values()) > budget:
            # 0 without micro-batch 2's step: a moment over the budget at 1 stays over it at every
            # larger micro-batch when its total grows with it, and its line's intercept (2 at1 - at2)
            # is higher still when it does not (`largest_affine` gives 0 either way)
            return 0
        at2 = self.totals(replace(setting, micro_batch=2))
        return largest_affine(((at1[key], at2[key]) for key in at1.keys() & at2.keys()), budget, limit)

    def _largest_seq(self, setting: StepSetting, budget: float, limit: int) -> int:
        """Largest sequence at `setting`'s micro-batch: `SequenceModel`'s line per moment (or quadratic,
        for models whose memory grows with its square), solved exactly."""
        if any(_weights(lines) > budget for lines in self.moments(setting).values()):
            # no sequence fits, with no step of another length: a moment's weights, gradients, their
            # copies and optimizer states do not depend on the length, and every length has the moment
            return 0
        best = float(limit)
        for a, b, c in self.sequences.polynomials(setting):
            best = min(best, _quadratic_root(a, b, c, budget))
        return max(0, int(min(best, limit)))

    def fit(self, setting: StepSetting, total_bytes: int, capacity: int) -> Fit:
        return fit_of(total_bytes, capacity, functools.partial(self.largest, setting, capacity))


_WEIGHT_LINES = ("parameters", "gradients", "optimizer_states", "master_weights", "weight_copies")
"""the lines of a moment that hold weights and what is kept per weight: the same at every micro-batch
and sequence length"""


def _weights(lines: Lines) -> int:
    return sum(lines[name] for name in _WEIGHT_LINES)


def _quadratic_root(a: float, b: float, c: float, budget: float) -> float:
    """The largest x >= 0 with a + b x + c x^2 <= budget."""
    if a > budget:
        return 0.0
    if c <= 1e-12 * max(1.0, abs(b)):
        return math.inf if b <= 0 else (budget - a) / b
    return (-b + math.sqrt(b * b - 4 * c * (a - budget))) / (2 * c)
