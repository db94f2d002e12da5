"""The precisions in order, under the budget's promise (`bench.budget`): fp32 first, then each other
precision with a plan made from fp32's warmup before it starts.

When fp32's worker reports its warmup (its step time, batch and the matmul share of its profiled
step), every other precision's plan is made and the expected wall time is printed, before fp32's
measured steps; each later worker gets what is left of the bench's allowance for measured windows.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ampkit.bench.budget import (
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

REPORT_S = 3.0  # the summary, plots and reports, after the last worker (a rough figure for the estimate)


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
    ) -> None:
        self.plan, self.console, self.progress, self.peaks = plan, console, progress, peaks
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
        ref_plan = reference_plan(ref, self.config, self.account)
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
            result = self.measure(name, job_plan, None)
            results.append(result)
            if result["status"] == "failed":
                self.console.print(f"[red]{name} failed:[/] {result['error']}", soft_wrap=True)
            self.account.spend(sum(result.get("step_s") or []))
            self._refresh_time_left(others[others.index(name) + 1 :])
        return results

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
        return plan_precision(
            name,
            self.config,
            ref,
            matmul_ratio=matmul_ratio(name, self.peaks),
            emulated=not is_native(name, self.plan.info),
            forced=name in self.plan.requested,
            dtype=candidate_spec(name).matmul_key,
            max_measure_s=max_measure_s,
        )

    def _on_reference_event(self, event: dict[str, Any]) -> None:
        if event.get("event") != "warm":
            return
        self.ref_warm = ReferenceWarm(
            step_s=float(event["step_s"]),
            batch_size=int(event["batch_size"]),
            matmul_share=event.get("matmul_share"),
            startup_s=float(event.get("startup_s") or 0.0),
            fidelity_s=float(event.get("fidelity_s") or 0.0),
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
        return (time.perf_counter() - self.started) + self._reference_window() + rest + REPORT_S

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

    def _refresh_time_left(self, remaining: list[str]) -> None:
        if self.expected_s is None:
            return
        rest = sum(self.plans[name].estimated_total_s or 0.0 for name in remaining)
        self.progress.set_expected_end(time.perf_counter() + rest + REPORT_S)

    def budget_block(self, results: list[dict[str, Any]], *, wall_s: float) -> dict[str, Any]:
        """summary["budget"]: the promise and what was spent (seconds)."""
        measured = sum(sum(r.get("step_s") or []) for r in results)
        fidelity = sum((r.get("plan") or {}).get("fidelity_s") or 0.0 for r in results)
        timed = sum(1 for r in results if r.get("status") == "ok")
        startup = max(0.0, wall_s - measured - fidelity)
        bound = bound_s(budget_s=self.config.budget_s, timed=timed, startup_s=startup, fidelity_s=fidelity)
        return {
            "budget_s": self.config.budget_s,
            "timed_precisions": timed,
            "measured_s": measured,
            "fidelity_s": fidelity,
            "startup_s": startup,
            "expected_s": self.expected_s,
            "wall_s": wall_s,
            "bound_s": None if self.config.steps else bound,
            "within_bound": None if self.config.steps else wall_s <= bound,
        }
