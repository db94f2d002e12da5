"""The precisions in order, under the budget's promise (`bench.budget`): fp32 first, then each other
precision with a plan made from fp32's warmup before it starts.

When fp32's worker reports its warmup (its step time, batch, the matmul share of its profiled
step and its GEMMs' speed in the other dtypes), every other precision's plan is made and the expected
wall time is printed, before fp32's measured steps; each later worker gets what is left of the
bench's allowance for measured windows. The progress bar's "time left" follows the same model, and
each later worker's own warmup report (its measured step) corrects it.

The expected time spans the bench's wall time as `started` counts it (the command's process start)
to its reports drawn (`budget.finished_s`): what has elapsed when fp32 reports, fp32's window and
exit, every other precision's `estimated_total_s`, and `REPORT_S`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ampkit.bench.budget import (
    EXIT_S,
    BudgetAccount,
    PrecisionPlan,
    ReferenceWarm,
    bound_s,
    expected_window_s,
    plan_precision,
    reference_plan,
)
from ampkit.bench.candidates import candidate_spec
from ampkit.bench.peaks import is_native, matmul_ratio

if TYPE_CHECKING:
    from rich.console import Console

    from ampkit.bench.config import BenchConfig
    from ampkit.hardware import DeviceInfo

REPORT_S = 3.0  # the summary, plots and reports after the last worker (matplotlib's import included; seconds)


class SessionPlan(Protocol):
    """What the session reads of a `runner.BenchPlan` (the runner imports this module)."""

    @property
    def config(self) -> BenchConfig: ...
    @property
    def info(self) -> DeviceInfo: ...
    @property
    def precisions(self) -> list[str]: ...
    @property
    def requested(self) -> tuple[str, ...]: ...


class ExpectedEnd(Protocol):
    """The progress display's "time left" row (`runner.BenchProgress`)."""

    def set_expected_end(self, when: float) -> None: ...


OnEvent = Callable[[dict[str, Any]], None]
"""A worker's progress event handler: one JSON object per event."""
Measure = Callable[[str, PrecisionPlan, OnEvent | None], dict[str, Any]]
"""`measure(name, job_plan, on_event) -> result`: one precision's worker, run to its end."""


class BenchSession:
    """Runs `measure(name, job_plan, on_event)` for every precision of `plan` (a runner.BenchPlan)."""

    def __init__(
        self,
        plan: SessionPlan,
        console: Console,
        progress: ExpectedEnd,
        peaks: dict[str, Any],
        *,
        measure: Measure,
        started: float,
        stopped: Callable[[], bool] = lambda: False,
        warm_start: bool = False,
    ) -> None:
        self.plan, self.console, self.progress, self.peaks = plan, console, progress, peaks
        self.warm_start = warm_start  # the workers after fp32's fork from a warm process: no imports of their own
        self.config = plan.config
        self.measure, self.started, self.stopped = measure, started, stopped
        self.account = BudgetAccount(self.config.budget_s)
        self.plans: dict[str, PrecisionPlan] = {}
        self.ref_warm: ReferenceWarm | None = None
        self.expected_s: float | None = None

    def run(self, refuse: Callable[[dict], None]) -> list[dict[str, Any]]:
        """Every precision's result, in order; `refuse(result)` stops the bench when fp32 fails. Once
        `stopped()` (a stop signal), no further precision starts: the results so far are returned."""
        ref, *others = self.plan.precisions
        if self.stopped():
            return []
        ref_plan = dataclasses.replace(reference_plan(ref, self.config, self.account), probe=self._probe_keys())
        self.plans[ref] = ref_plan
        result = self.measure(ref, ref_plan, self._on_reference_event)
        results = [result]
        if self.stopped():
            return results
        if result["status"] != "ok":
            refuse(result)
        self.account.spend(sum(result.get("step_s") or []))
        for name in others:
            if self.stopped():
                break
            job_plan = self._plan_now(name, others)
            after = others[others.index(name) + 1 :]
            result = self.measure(name, job_plan, functools.partial(self._on_event, name, after=after))
            results.append(result)
            if result["status"] == "failed":
                self.console.print(f"[red]{name} failed:[/] {result['error']}", soft_wrap=True)
            self.account.spend(sum(result.get("step_s") or []))
            self._refresh_time_left(others[others.index(name) + 1 :])
        return results

    def _probe_keys(self) -> dict[str, float | None]:
        """The other precisions' compute dtypes (fp32's worker times its GEMMs in them), each with the peaks' ratio."""
        keys = {candidate_spec(name).matmul_key: name for name in self.plan.precisions[1:]}
        return {key: matmul_ratio(name, self.peaks) for key, name in keys.items() if key != "fp32"}

    def _plan_now(self, name: str, others: list[str]) -> PrecisionPlan:
        """The plan made at fp32's warmup, with what the account leaves now for its measured window."""
        planned = self.plans.get(name) or self._plan(name, max_measure_s=self.config.budget_s)
        after = others[others.index(name) + 1 :]
        still = sum(1 for other in after if self.plans.get(other) is None or self.plans[other].timed)
        planned = dataclasses.replace(planned, max_measure_s=self.account.allowance(still_to_come=still))
        self.plans[name] = planned
        return planned

    def _plan(self, name: str, *, max_measure_s: float) -> PrecisionPlan:
        ref = self.ref_warm or ReferenceWarm(
            step_s=0.0, batch_size=self.config.data.batch_size, matmul_share=None, startup_s=0.0, fidelity_s=0.0
        )
        key = candidate_spec(name).matmul_key
        probed = (ref.matmul_ratios or {}).get(key)
        return plan_precision(
            name,
            self.config,
            ref,
            matmul_ratio=probed or matmul_ratio(name, self.peaks),
            emulated=not is_native(name, self.plan.info),
            forced=name in self.plan.requested,
            dtype=key,
            max_measure_s=max_measure_s,
            ratio_source="step" if probed else "peak",
        )

    def _on_reference_event(self, event: dict[str, Any]) -> None:
        if event.get("event") != "warm":
            return
        self.ref_warm = ReferenceWarm(
            step_s=float(event["step_s"]),
            batch_size=int(event["batch_size"]),
            matmul_share=event.get("matmul_share"),
            startup_s=float(event.get("startup_s") or 0.0),
            later_startup_s=max(0.0, float(event.get("startup_s") or 0.0) - float(event.get("imports_s") or 0.0))
            if self.warm_start
            else None,
            fidelity_s=float(event.get("fidelity_s") or 0.0),
            first_s=event.get("first_s"),
            warmup_s=event.get("warmup_s"),
            warmup_steps=event.get("warmup_steps"),
            matmul_ratios=event.get("matmul_ratios") or None,
        )
        others = self.plan.precisions[1:]
        for name in others:  # the first pass: which ones are timed at all
            self.plans[name] = self._plan(name, max_measure_s=self.config.budget_s)
        self.account.timed = 1 + sum(self.plans[name].timed for name in others)
        simulated = BudgetAccount(self.config.budget_s)  # then what each may expect, spends simulated in order
        simulated.timed = self.account.timed
        simulated.spend(self._reference_window())
        for index, name in enumerate(others):
            if not self.plans[name].timed:
                continue
            still = sum(self.plans[o].timed for o in others[index + 1 :])
            allowance = simulated.allowance(still_to_come=still)
            self.plans[name] = self._plan(name, max_measure_s=allowance)
            step = self.plans[name].estimated_step_s or self.ref_warm.step_s
            simulated.spend(expected_window_s(step, self.config, max_measure_s=allowance))
        self.expected_s = self._expected_total()
        self.console.print(self.expected_line(), soft_wrap=True, highlight=False)
        self.progress.set_expected_end(self.started + self.expected_s)

    def _reference_window(self) -> float:
        assert self.ref_warm is not None
        ref_plan = self.plans[self.plan.precisions[0]]
        return expected_window_s(self.ref_warm.step_s, self.config, max_measure_s=ref_plan.max_measure_s)

    def _expected_total(self) -> float:
        rest = sum(self.plans[name].estimated_total_s or 0.0 for name in self.plan.precisions[1:])
        return (time.perf_counter() - self.started) + self._reference_window() + EXIT_S + rest + REPORT_S

    def expected_line(self) -> str:
        """ "expected: ~74 s in all (...)": printed before fp32's measured steps."""
        config, ref = self.config, self.plan.precisions[0]
        timed = [name for name in self.plan.precisions if self.plans[name].timed]
        head = (
            f"expected: ~{self.expected_s:.0f} s in all ({config.budget_s:g} s of measured steps x {len(timed)} "
            f"timed precision{'s' if len(timed) != 1 else ''}, plus start-up and fidelity)"
            if not config.steps
            else f"expected: ~{self.expected_s:.0f} s in all (--steps {config.steps}: no budget applies)"
        )
        notes = [f"{ref} ~{self.ref_warm.step_s:.2f} s/step" if self.ref_warm else ref]
        for name in self.plan.precisions[1:]:
            p = self.plans[name]
            estimate = f"~{p.estimated_step_s:.2f} s/step" if p.estimated_step_s else "no estimate"
            notes.append(f"{name} {p.reason}" if p.reason else f"{name} {estimate}")
        return head + ": " + "; ".join(notes)

    def _refresh_time_left(self, remaining: list[str], *, running_s: float = 0.0) -> None:
        """The progress bar's expected end: `running_s` left of the running worker, then the rest."""
        if self.expected_s is None:
            return
        rest = sum(self.plans[name].estimated_total_s or 0.0 for name in remaining)
        self.progress.set_expected_end(time.perf_counter() + running_s + rest + REPORT_S)

    def _on_event(self, name: str, event: dict[str, Any], *, after: list[str]) -> None:
        """A later worker's warmup report: its own measured step, hence its window, corrects the time left."""
        if event.get("event") != "warm":
            return
        plan = self.plans[name]
        window = expected_window_s(float(event["step_s"]), self.config, max_measure_s=plan.max_measure_s)
        self._refresh_time_left(after, running_s=window + EXIT_S)

    def budget_block(self, results: list[dict[str, Any]], *, wall_s: float) -> dict[str, Any]:
        """summary["budget"]: the promise, what was spent and where (seconds). `startup_s` is all but the
        measured steps and fidelity (the bound's term); of it, the workers' start-up (process start to
        the run built), their warmup, and the bench's own process (`parent_s`: imports, checks, peaks)."""
        measured = sum(sum(r.get("step_s") or []) for r in results)
        fidelity = sum(_plan_s(r, "fidelity_s") for r in results)
        timed = sum(1 for r in results if r.get("status") == "ok")
        startup = max(0.0, wall_s - measured - fidelity)
        bound = bound_s(budget_s=self.config.budget_s, timed=timed, startup_s=startup, fidelity_s=fidelity)
        return {
            "budget_s": self.config.budget_s,
            "timed_precisions": timed,
            "measured_s": measured,
            "fidelity_s": fidelity,
            "startup_s": startup,
            "worker_startup_s": sum(_plan_s(r, "startup_s") for r in results),
            "warmup_s": sum(_plan_s(r, "warmup_s") + _plan_s(r, "probe_s") for r in results),
            "parent_s": max(0.0, wall_s - sum(r.get("worker_s") or 0.0 for r in results)),
            "expected_s": self.expected_s,
            "wall_s": wall_s,
            "bound_s": None if self.config.steps else bound,
            "within_bound": None if self.config.steps else wall_s <= bound,
        }


def _plan_s(result: dict[str, Any], key: str) -> float:
    """Seconds a worker reported in its plan (0 when it did not: failed, or not timed)."""
    return float((result.get("plan") or {}).get(key) or 0.0)
