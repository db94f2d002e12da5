"""The largest sequence a traced step fits: each moment a line in the sequence length, checked once a plan.

At a fixed micro-batch B, a moment's total at sequence length T is

    c + p*B*T + q*T    (+ r*B*T^2 where attention materialises its T x T scores: eager attention)

- c: weights, gradients, optimizer states and scratch, and the loss's fp32 chunk where its rows are
  the floor (`models/loss.py`): fixed;
- p*B*T: what each sample keeps per token (activations, their gradients, the logits and the loss's
  chunk above its floor);
- q*T: per-token tensors the batch shares (the rotary tables).

The largest micro-batch already traces B = 1 and 2 at the step's length T0, which splits every moment
into c + q*T0 (the batch's) and p*T0 (a sample's). The same pair of the plan's first setting at
`check_length` (2*T0) checks that a sample's share grows in proportion to T (within `LINE_TOLERANCE`
of the peak there) and gives each moment's q. Every setting's largest sequence is then its lines'
root, with q from the first setting per moment (the same shared tensors in every setting; 0 for a
moment it does not have): no traces beyond the micro-batch pair. Where the check fails (a sample's
memory grows with T^2: eager attention's scores, per-layer masks), each setting traces its own
micro-batch at the check length too, which gives a sample's share there, and with it p and r of
p*T + r*T^2 per moment (q still the first setting's). The T x T tensors are made outside the block
Linears, so a low-bit Linears precision (fp8) takes r from the setting with plain Linears and the same
weights, compute dtype and autocast (`sharing.attention_precision`: bf16-mixed), and p from its own pair:
one traced length fewer a setting, on its costliest traces (float8 Linears ~2.1x; checked against its
own trace in tests/plan/traced/test_extrapolate.py). Where no check can be made (a one-token step,
moments that differ between lengths), three lengths a setting are traced (`seq_points`).

The check length lies above T0 (half of it only where the model's positions leave no room): fits are
searched above T0, and below it the loss's chunk floor bends the totals. A quadratic through T0/4,
T0/2 and T0 (this engine before) put Qwen3-0.6B's bf16-mixed edge on an H100 at 14,590 tokens, where
the trace says 24,406; this model says 24,407 (29 KB over, of 79.2 GiB: the first setting's q lacks
bf16-mixed's autocast copies of the rotary tables). Units: bytes and tokens.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from ampkit.plan.describe.hf import HFDescription
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced.sharing import attention_precision


class Engine(Protocol):
    """What the model reads of the traced engine (`extrapolate.HFTracedEngine`)."""

    desc: HFDescription

    def totals(self, setting: StepSetting) -> dict[str, int]: ...


LINE_TOLERANCE = 1e-3
"""how far a sample's share at the check length may miss its proportional growth, relative to the
traced peak there (exact byte counts: a miss is memory that grows faster than T)"""
Polynomial = tuple[float, float, float]
"""(a, b, c): a moment's total a + b*T + c*T^2 at a setting's micro-batch, in bytes"""


def check_length(seq_len: int, limit: int | None) -> int:
    """The length the line is checked at: twice the step's, or half of it when the model's positions
    stop short of twice."""
    return 2 * seq_len if not limit or 2 * seq_len <= limit else max(1, seq_len // 2)


def seq_points(seq_len: int, limit: int | None) -> list[int]:
    """Three lengths for a quadratic: the step's and its next two doublings where the model's positions
    allow them, else halvings (fewer than three only for steps of one or two tokens)."""
    up = [t for t in (seq_len, 2 * seq_len, 4 * seq_len) if not limit or t <= limit]
    down = [max(1, seq_len // d) for d in (2, 4, 8)]
    return sorted(set(up + down), key=lambda t: (t < seq_len, abs(t - seq_len)))[:3]


class SequenceModel:
    """The sequence lengths an engine's settings grow to: a line per moment, or, when the first
    setting's check fails, a quadratic per moment from one more traced length a setting."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._shared: dict[str, float] | None = None
        """q per moment (bytes per token), from the first setting's check"""
        self._linear = False
        self._checked = False
        self._reference: StepSetting | None = None
        """the setting the check is made on (`pin`); None: the first one asked"""

    @property
    def _limit(self) -> int | None:
        return self.engine.desc.max_positions

    def _checked_length(self, setting: StepSetting) -> int:
        return check_length(setting.seq_len, self._limit)

    def check_settings(self, setting: StepSetting) -> list[StepSetting]:
        """The steps the check traces: `setting`'s micro-batch pair at the check length."""
        longer = replace(setting, seq_len=self._checked_length(setting))
        return [replace(longer, micro_batch=m) for m in (1, 2)]

    def quadratic_settings(self, setting: StepSetting) -> list[StepSetting]:
        """The steps a quadratic of `setting` reads beyond its micro-batch pair (after a failed check):
        its own micro-batch at the check length, or three lengths where the check could not be made."""
        if self._shared is not None:
            return self.far_settings(setting)
        return [replace(setting, seq_len=t) for t in seq_points(setting.seq_len, self._limit)]

    def far_settings(self, setting: StepSetting) -> list[StepSetting]:
        """The steps `setting`'s quadratic reads when the check has failed (what a prefetch may trace
        before the check where a failure is expected: eager attention): its donor's micro-batch at
        the check length, and the donor's pair where the donor is another setting."""
        donor = self.donor(setting)
        pair = [] if donor == setting else [replace(donor, micro_batch=m) for m in (1, 2)]
        return [replace(donor, seq_len=self._checked_length(setting)), *pair]

    @staticmethod
    def donor(setting: StepSetting) -> StepSetting:
        """The setting whose trace at the check length gives `setting`'s T^2 coefficients (itself, but
        for a low-bit Linears precision: `attention_precision`)."""
        return replace(setting, precision=attention_precision(setting.precision))

    def pin(self, setting: StepSetting) -> None:
        """Make the check on `setting` (a plan's first), whichever setting asks first (a setting whose
        weights alone exceed the GPU asks nothing: `HFTracedEngine.largest`)."""
        if not self._checked:
            self._reference = setting

    def linear(self, setting: StepSetting) -> bool:
        """Whether the line holds (checked once: on the pinned setting, else the first one asked)."""
        if not self._checked:
            self._checked = True
            self._check(self._reference or setting)
        return self._linear

    def _pair(self, setting: StepSetting) -> dict[str, tuple[int, int]]:
        """Each moment's totals at micro-batch 1 and 2 (at `setting`'s length)."""
        one = self.engine.totals(replace(setting, micro_batch=1))
        two = self.engine.totals(replace(setting, micro_batch=2))
        return {key: (one[key], two[key]) for key in one.keys() & two.keys()}

    def _check(self, setting: StepSetting) -> None:
        """q per moment, and whether what each sample adds grows in proportion to the length at every
        moment. The pair at the check length splits each moment, as at T0, into what a sample adds
        (p*T: the check) and what the batch shares (c + q*T: its change gives q)."""
        length, checked = setting.seq_len, self._checked_length(setting)
        if checked == length:
            return
        here, there = self._pair(setting), self._pair(replace(setting, seq_len=checked))
        if not there or set(here) != set(there):
            return
        tolerance = LINE_TOLERANCE * max(two for _, two in there.values())
        self._shared, self._linear = {}, True
        for key, (one, two) in here.items():
            far_one, far_two = there[key]
            per_sample, far_per_sample = two - one, far_two - far_one
            if abs(far_per_sample - per_sample * checked / length) > tolerance:  # grows faster: T x T scores
                self._linear = False
            self._shared[key] = ((far_one - far_per_sample) - (one - per_sample)) / (checked - length)

    def polynomials(self, setting: StepSetting) -> list[Polynomial]:
        """Each moment's total as a polynomial in the sequence length, at `setting`'s micro-batch."""
        batch, length = setting.micro_batch, setting.seq_len
        linear = self.linear(setting)
        if self._shared is None:  # no check was possible: three traced lengths
            points = seq_points(length, self._limit)
            tables = [self.engine.totals(replace(setting, seq_len=t)) for t in points]
            keys = set.intersection(*(set(t) for t in tables))
            return [_through(points, [t[key] for t in tables]) for key in keys]
        squares = {} if linear else self._squares(self.donor(setting))
        out = []
        for key, (fixed, per_sample) in self._shares(setting).items():
            q = self._shared.get(key, 0.0)
            if key not in squares:
                out.append((fixed, q + batch * per_sample / length, 0.0))
                continue
            r = squares[key]
            p = per_sample / length - r * length  # a sample's share at T0 is p*T0 + r*T0^2
            out.append((fixed, q + batch * p, batch * r))
        return out

    def _shares(self, setting: StepSetting) -> dict[str, tuple[float, float]]:
        """Each moment's (c, a sample's share at the step's length: p*T0 + r*T0^2), from the pair."""
        assert self._shared is not None, "the shares need q, from the check"
        length, out = setting.seq_len, dict[str, tuple[float, float]]()
        for key, (one, two) in self._pair(setting).items():
            per_sample = two - one
            out[key] = (one - per_sample - self._shared.get(key, 0.0) * length, per_sample)
        return out

    def _squares(self, setting: StepSetting) -> dict[str, float]:
        """r per moment (bytes per token^2 a sample), from `setting`'s own trace at the check length:
        a sample's share there and at the step's length split into p*T + r*T^2."""
        assert self._shared is not None, "the shares need q, from the check"
        length, checked = setting.seq_len, self._checked_length(setting)
        far = self.engine.totals(replace(setting, seq_len=checked))
        out: dict[str, float] = {}
        for key, (fixed, per_sample) in self._shares(setting).items():
            if key in far:
                far_per_sample = (far[key] - fixed - self._shared.get(key, 0.0) * checked) / setting.micro_batch
                out[key] = _split(length, per_sample, checked, far_per_sample)[1]
        return out


def _split(t0: int, at0: float, t1: int, at1: float) -> tuple[float, float]:
    """(p, r) with p*t + r*t^2 equal to `at0` at `t0` and `at1` at `t1`."""
    r = (at1 / t1 - at0 / t0) / (t1 - t0)
    return at0 / t0 - r * t0, r


def _through(points: list[int], values: list[int]) -> Polynomial:
    """The polynomial of degree len(points) - 1 (at most 2) through the points."""
    if len(points) == 1:
        return (float(values[0]), 0.0, 0.0)
    if len(points) == 2:
        (x0, x1), (y0, y1) = points, values
        slope = (y1 - y0) / (x1 - x0)
        return (y0 - slope * x0, slope, 0.0)
    (x0, x1, x2), (y0, y1, y2) = points, values
    c = ((y2 - y0) / (x2 - x0) - (y1 - y0) / (x1 - x0)) / (x2 - x1)
    b = (y1 - y0) / (x1 - x0) - c * (x0 + x1)
    return (y0 - b * x0 - c * x0 * x0, b, c)
