"""The budget is a promise: how long each precision may take, decided from measured step times.

`--budget-s B` is each precision's *measured window* (its timed steps). Around it, each precision pays
start-up (a process, the model, `warmup` untimed steps of which the last is profiled) and its fidelity
capture. The whole bench stays within

    (B x timed precisions + start-up + fidelity) x 1.2        (`bound_s`)

because every decision below is made from a step time measured or estimated *before* the steps run:
- warmup: at most `warmup_steps`, and no more than half the budget's worth (at least 2: one cold
  step and the profiled one), `warmup_plan`;
- the measured window (`measure_window`): `--min-steps` are kept while they fit twice the budget
  and the bench's allowance (1.2 x B x timed precisions, less what earlier precisions spent: the
  `BudgetAccount`); otherwise the precision is measured for its budget only, flagged "few steps";
- a precision whose single step would overrun the budget (`plan_precision`): by default, where its
  compute dtype is emulated, it is not timed at all (the measured matmul slowdown is the evidence;
  naming it in `--precisions` times it); otherwise it runs on a reduced batch, and says so;
- fidelity always runs, on the full capture (4 rows) or, when that would take more than half the
  budget, on 1 row (compared with fp32's 1-row capture).
A step time not yet measured (every precision but fp32 before it runs) is estimated from fp32's: by
Amdahl's law, the matmul/attention share of fp32's profiled step scaled by the matmul slowdown of
the precision's compute dtype on this device (`estimate_step_s`): the ratio of fp32's own GEMMs
timed in that dtype by fp32's worker (`bench.gemm_probe`), else the device's large-matmul peaks.
The expected wall time (`expected_total_s` per precision, summed by `bench.session`) is each
worker's start-up (process, imports, model: fp32's), its fidelity capture (fp32's per row, slowed
as its step), its warmup (fp32's warmup steps, profiled one and cold first step included, slowed
as its step, for as many steps as it will run), its measured window and its exit (`EXIT_S`).
`--steps N` asks for exactly N steps: no budget applies, the expected time is still printed.
Pure functions on plain numbers: the logic is tested on synthetic timings. Units: seconds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampkit.bench.config import BenchConfig

BOUND_FACTOR = 1.2
"""the whole bench's wall time stays within this factor of (budget x precisions + start-up + fidelity)"""
MIN_STEPS_OVERRUN = 2.0
"""min steps are kept up to this multiple of the budget (and the bench's allowance)"""
WARMUP_SHARE = 0.5
"""warmup steps take at most this share of the budget (never fewer than 2 steps: cold + profiled)"""
FIDELITY_SHARE = 0.5
"""the fidelity capture takes at most this share of the budget, else it runs on 1 row"""
REDUCED_STEP_SHARE = 0.25
"""a reduced batch aims at a step of this share of the budget (a few steps fit in it)"""
FULL_FIDELITY_ROWS, MIN_FIDELITY_ROWS = 4, 1
EXIT_S = 0.1
"""a worker's end after its measured window: the result written, the process gone (it skips the
interpreter's teardown, `shutdown.end_process`); the parent reading the result"""


def estimate_step_s(reference_step_s: float, *, matmul_share: float | None, matmul_ratio: float | None) -> float:
    """A precision's step time from fp32's: Amdahl's law on the matmul/attention share of fp32's
    profiled step, those matmuls running `matmul_ratio` times as fast (0.05: emulated, 20x slower);
    the rest of the step as fast as fp32's. No share measured: the whole step scales (pessimistic
    for a slower dtype). No ratio: fp32's step time."""
    if not matmul_ratio or matmul_ratio <= 0:
        return reference_step_s
    share = 1.0 if matmul_share is None else min(1.0, max(0.0, matmul_share))
    return reference_step_s * ((1.0 - share) + share / matmul_ratio)


def amdahl_speedup(matmul_share: float, factor: float) -> float:
    """Step speedup when the `matmul_share` of a step runs `factor` times as fast (the rest unchanged)."""
    share = min(1.0, max(0.0, matmul_share))
    return 1.0 / ((1.0 - share) + share / factor) if factor > 0 else 0.0


def warmup_plan(first_step_s: float, *, warmup_steps: int, budget_s: float) -> int:
    """Untimed steps in all: `warmup_steps`, cut to about `WARMUP_SHARE` of the budget's worth of
    `first_step_s`, and never fewer than 2 (a cold first step, then the profiled one)."""
    affordable = math.floor(WARMUP_SHARE * budget_s / first_step_s) if first_step_s > 0 else warmup_steps
    return max(2, min(warmup_steps, affordable))


@dataclass(frozen=True, kw_only=True)
class Window:
    """How a precision's measured steps end: keep stepping while fewer than `min_steps` ran or the
    next step, as long as the last one, ends within `timed_s` (`max_steps` always ends it)."""

    timed_s: float
    min_steps: int
    few_steps: bool
    """measured for the budget only: `--min-steps` did not fit"""
    reason: str | None = None

    def keep_going(self, measured: int, elapsed_s: float, last_step_s: float) -> bool:
        return measured < self.min_steps or elapsed_s + last_step_s <= self.timed_s


def measure_window(step_s: float, *, budget_s: float, min_steps: int, max_measure_s: float) -> Window:
    """The measured window for a precision whose steps take `step_s`: the budget, with `min_steps`
    kept while they fit `min(2 x budget, max_measure_s)`; otherwise the budget only (at least 1 step)."""
    need = min_steps * step_s
    allowed = min(MIN_STEPS_OVERRUN * budget_s, max_measure_s)
    if need <= max(budget_s, allowed):
        return Window(timed_s=budget_s, min_steps=min_steps, few_steps=False)
    why = (
        f"few steps: {min_steps} steps would take ~{need:.0f} s, over "
        + (f"{MIN_STEPS_OVERRUN:g}x" if allowed >= MIN_STEPS_OVERRUN * budget_s else "what the bench's total allows of")
        + f" --budget-s {budget_s:g}"
    )
    return Window(timed_s=budget_s, min_steps=1, few_steps=True, reason=why)


def window_seconds(step_s: float, window: Window, max_steps: int) -> float:
    """Expected seconds of a window: the budget, or `min_steps` steps when longer, capped by max steps."""
    return min(max_steps * step_s, max(window.timed_s, window.min_steps * step_s))


def reduced_batch(batch_size: int, step_s: float, budget_s: float) -> int:
    """The batch whose step takes about `REDUCED_STEP_SHARE` of the budget (steps scale with the batch)."""
    return max(1, min(batch_size, math.floor(batch_size * REDUCED_STEP_SHARE * budget_s / step_s)))


def fidelity_rows(step_s: float, batch_size: int, budget_s: float) -> int:
    """4 rows, or 1 when a forward and backward of 4 rows (~4/batch of a step) would take over half the budget."""
    full = step_s * min(FULL_FIDELITY_ROWS, batch_size) / max(1, batch_size)
    return FULL_FIDELITY_ROWS if full <= FIDELITY_SHARE * budget_s else MIN_FIDELITY_ROWS


class BudgetAccount:
    """The bench-wide allowance for measured windows: `BOUND_FACTOR` x budget x timed precisions.
    fp32 (first, before anything is known) may use `BOUND_FACTOR` x budget; each later precision what
    is left after reserving one budget for every timed precision still to come."""

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.timed = 1
        self.spent_s = 0.0

    def reference_allowance(self) -> float:
        return BOUND_FACTOR * self.budget_s

    def allowance(self, *, still_to_come: int) -> float:
        left = BOUND_FACTOR * self.budget_s * self.timed - self.spent_s
        return max(self.budget_s, left - self.budget_s * still_to_come)

    def spend(self, seconds: float) -> None:
        self.spent_s += seconds


@dataclass(frozen=True, kw_only=True)
class ReferenceWarm:
    """What fp32's worker says after its warmup: the facts every later estimate rests on."""

    step_s: float
    """a steady warmup step (the profiled one when it was the only other)"""
    batch_size: int
    """the batch fp32 measures on (reduced when its single step overran the budget)"""
    matmul_share: float | None
    """the matmul/attention share of fp32's profiled step (None: not profiled)"""
    startup_s: float
    """the worker's start: process, imports, model, data (until its fidelity capture)"""
    later_startup_s: float | None = None
    """a later worker's start where it differs from fp32's: the imports left out when the workers fork from
    a warm process that made them once (`bench.zygote`); None: each later worker starts as fp32's did"""
    fidelity_s: float
    """its fidelity captures (4 rows and 1)"""
    first_s: float | None = None
    """its cold first step (one-time costs: allocation, kernel set-up)"""
    warmup_s: float | None = None
    """its whole warmup: the cold step, the steady ones and the profiled one (None: not reported)"""
    warmup_steps: int | None = None
    """how many untimed steps that was"""
    matmul_ratios: dict[str, float] | None = None
    """its own GEMMs timed in each other dtype, as fp32's speed over that dtype's (`bench.gemm_probe`)"""


@dataclass(frozen=True, kw_only=True)
class PrecisionPlan:
    """What a precision's worker is asked to do, and why."""

    name: str
    mode: str
    """"full", "reduced-batch", "not-timed" or "exact-steps" ("few steps" is decided by the worker)"""
    reason: str | None = None
    """why the mode is not "full" (None when it is)"""
    batch_size: int
    """rows per step: the configured batch size, or fewer in the reduced-batch mode"""
    fidelity_rows: int
    max_measure_s: float
    """seconds the measured window may stretch to so that --min-steps fit (the bench's total allows it)"""
    estimated_step_s: float | None = None
    estimated_total_s: float | None = None
    probe: dict[str, float | None] = field(default_factory=dict)
    """fp32's only: the dtype keys its worker times its GEMMs in (`bench.gemm_probe`), each with the
    device's large-matmul ratio, which bounds what a shape may cost before it is timed"""

    @property
    def timed(self) -> bool:
        return self.mode != "not-timed"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reference_plan(name: str, config: BenchConfig, account: BudgetAccount) -> PrecisionPlan:
    """fp32 runs at the bench's batch (its worker reduces it itself if one step overruns the budget)."""
    mode = "exact-steps" if config.steps else "full"
    return PrecisionPlan(
        name=name,
        mode=mode,
        batch_size=config.data.batch_size,
        fidelity_rows=FULL_FIDELITY_ROWS,
        max_measure_s=account.reference_allowance(),
    )


def plan_precision(
    name: str,
    config: BenchConfig,
    ref: ReferenceWarm,
    *,
    matmul_ratio: float | None,
    emulated: bool,
    forced: bool,
    dtype: str,
    max_measure_s: float,
    ratio_source: str = "peak",
) -> PrecisionPlan:
    """A non-reference precision's plan from fp32's warmup (`ref`) and its dtype's measured matmul ratio
    (`ratio_source`: "step", fp32's own GEMMs timed in the dtype; "peak", the device's large matmul)."""
    step = estimate_step_s(ref.step_s, matmul_share=ref.matmul_share, matmul_ratio=matmul_ratio)
    budget, batch = config.budget_s, ref.batch_size

    def made(mode: str, batch_size: int, step_s: float, reason: str | None = None) -> PrecisionPlan:
        rows = FULL_FIDELITY_ROWS if mode == "exact-steps" else fidelity_rows(step_s, batch_size, budget)
        plan = PrecisionPlan(
            name=name,
            mode=mode,
            batch_size=batch_size,
            fidelity_rows=rows,
            max_measure_s=max_measure_s,
            estimated_step_s=step_s,
            reason=reason,
        )
        return _with_total(plan, config, ref)

    if config.steps:
        return made("exact-steps", batch, step)
    if step <= budget:
        return made("full", batch, step)
    slow = f"one step would take ~{step:.0f} s > --budget-s {budget:g}"
    probe = (
        "this model's GEMMs, timed in fp32's worker"
        if ratio_source == "step"
        else "a large matmul, measured as `ampkit hw` does"  # not this model's matmuls: the budget's evidence only
    )
    evidence = f"{dtype} matmuls run at {_ratio(matmul_ratio)} fp32's speed here ({probe})"
    if emulated and not forced:
        return made("not-timed", batch, step, f"not timed: emulated, {evidence}; {slow} (--precisions {name} times it)")
    small = reduced_batch(batch, step, budget)
    why = f"reduced batch {small} (of {batch}): {slow}" + (f"; {evidence}" if emulated else "")
    return made("reduced-batch", small, step * small / batch, why)


def _ratio(value: float | None) -> str:
    if value is None:
        return "an unmeasured"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _with_total(plan: PrecisionPlan, config: BenchConfig, ref: ReferenceWarm) -> PrecisionPlan:
    """The plan with its expected seconds: start-up, fidelity, warmup, the measured window, the exit."""
    step = plan.estimated_step_s or ref.step_s
    slowdown = step / ref.step_s if ref.step_s > 0 else 1.0
    per_row = ref.fidelity_s / (FULL_FIDELITY_ROWS + MIN_FIDELITY_ROWS)  # fp32 captured 4 rows and 1
    startup = ref.startup_s if ref.later_startup_s is None else ref.later_startup_s
    total = startup + per_row * plan.fidelity_rows * slowdown + EXIT_S
    if plan.timed:
        total += expected_warmup_s(step, config, ref)
        total += expected_window_s(step, config, max_measure_s=plan.max_measure_s)
    return PrecisionPlan(**{**plan.to_dict(), "estimated_total_s": total})


def expected_warmup_s(step_s: float, config: BenchConfig, ref: ReferenceWarm) -> float:
    """A precision's warmup from fp32's: fp32's whole warmup (its cold first step and profiled step
    included) slowed as the step is, for the number of steps `warmup_plan` gives its own cold step.
    Without fp32's warmup reported: that many steps of `step_s`."""
    slowdown = step_s / ref.step_s if ref.step_s > 0 else 1.0
    cold_s = (ref.first_s or ref.step_s) * slowdown
    steps = warmup_plan(cold_s, warmup_steps=config.warmup_steps, budget_s=config.budget_s)
    if not ref.warmup_s or not ref.warmup_steps:
        return steps * step_s
    return slowdown * (ref.warmup_s + (steps - ref.warmup_steps) * ref.step_s)


def expected_window_s(step_s: float, config: BenchConfig, *, max_measure_s: float) -> float:
    lo, hi = config.measured_steps_range
    if config.steps:
        return config.steps * step_s
    window = measure_window(step_s, budget_s=config.budget_s, min_steps=lo, max_measure_s=max_measure_s)
    return window_seconds(step_s, window, hi)


def bound_s(*, budget_s: float, timed: int, startup_s: float, fidelity_s: float) -> float:
    """The promise: (budget x timed precisions + start-up + fidelity) x BOUND_FACTOR."""
    return BOUND_FACTOR * (budget_s * timed + startup_s + fidelity_s)
