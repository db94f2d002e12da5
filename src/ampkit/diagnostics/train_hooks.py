"""What `ampkit train` attaches for `--detect-nonfinite`, `--grad-stats-every N` and `--inject`.

`--grad-stats-every N` attaches two meters: the gradient statistics and the update-underflow meter
(`ampkit.diagnostics.underflow`: updates lost to rounding, layers frozen), written to metrics.jsonl as
"grad_stats", "update_stats" and (once per layer) "frozen_layer" records.

All three are hooks on the model; the loop calls `begin_step(step)` before a step and
`at_log_step(step, metrics)` at log steps, where the gradient statistics are moved to the host
(their only sync) and a new non-finite finding is written to metrics.jsonl. With everything off,
`build_train_diagnostics` returns `NoDiagnostics`, which does nothing and places no hook.

Under `--parallel ddp|fsdp` each rank hooks its own model (DDP's wrapped module, so paths stay the
task's) and locates on its own; at each log step the ranks' first findings and fired faults are
gathered (every rank: a collective) so rank 0's metrics and summary name the rank and module where
the first non-finite value appeared. `--inject-rank R` attaches the fault on rank R alone. The
gradient meters (DDP only) are rank 0's: its micro-batches' gradients before the all-reduce; the
updates of the replicated weights, equal on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampkit.diagnostics.gradstats import GradientStatistics
from ampkit.diagnostics.inject import FaultInjector
from ampkit.diagnostics.locator import NonFiniteLocator
from ampkit.diagnostics.underflow import UpdateUnderflowMeter
from ampkit.distributed.settings import check_inject_rank
from ampkit.distributed.wrap import unwrap

if TYPE_CHECKING:
    from ampkit.core.parallel import LocalRun
    from ampkit.sections import GuardSection

_PHASE_ORDER = {"forward": 0, "backward": 1}


def _order(finding: dict[str, Any]) -> tuple[int, int, bool]:
    """When a finding happened, as far as ranks can compare: step, phase, reduced gradient last."""
    return finding["step"], _PHASE_ORDER.get(finding["phase"], 2), finding["site"] == "param_grad"


class NoDiagnostics:
    """Every diagnostic off: no hooks, no cost."""

    def begin_step(self, step: int) -> None:
        """Nothing to arm."""

    def at_log_step(self, step: int, metrics) -> None:
        """Nothing to report."""

    def arm_locator(self) -> bool:
        """No model to hook."""
        return False

    def close(self) -> None:
        """Nothing attached."""

    def summary(self) -> dict[str, Any]:
        return {}


class TrainDiagnostics:
    """The enabled diagnostics of one run (any of locator, gradient statistics, fault injector)."""

    def __init__(
        self, model, policy, settings: GuardSection, *, micro_batches: int, optimizer=None, parallel: LocalRun
    ):
        """Attach to `model` what the run's `[guard]` section turns on; `micro_batches`: per optimizer
        step; `optimizer` lets the update-underflow meter see what each step changed; `parallel`: the
        run's world (the ranks whose findings are gathered)."""
        self.parallel, self.model = parallel, model
        self.locator: NonFiniteLocator | None = None
        self.stats: GradientStatistics | None = None
        self.updates: UpdateUnderflowMeter | None = None
        self.injector: FaultInjector | None = None
        try:
            self._attach(policy, settings, micro_batches=micro_batches, optimizer=optimizer)
        except BaseException:
            self.close()  # a hook refused (a ScriptModule's) or a bad fault: nothing stays on the model
            raise
        self._frozen_reported: set[str] = set()
        self.inject = {"spec": settings.inject, "rank": settings.inject_rank} if settings.inject else None
        self._reported = False
        self.first: dict[str, Any] | None = None
        """the job's first non-finite finding (gathered at log steps), with its rank under --parallel"""
        self.fired: list[list[int]] = [[] for _ in range(parallel.world_size)]
        """each rank's fired steps (gathered at log steps)"""

    def begin_step(self, step: int) -> None:
        if self.locator is not None:
            self.locator.begin_step(step)
        if self.stats is not None:
            self.stats.begin_step(step)
        if self.updates is not None:
            self.updates.begin_step(step)

    def _attach(self, policy, settings: GuardSection, *, micro_batches: int, optimizer) -> None:
        """Each hook object kept before it attaches, so `close` removes what a refusal left half attached."""
        model, every = self.model, settings.grad_stats_every
        if settings.detect_nonfinite:
            self.locator = NonFiniteLocator(model)
            self.locator.attach()
        if every:
            self.stats = GradientStatistics(model, every=every, micro_batches=micro_batches, scale_fn=policy.loss_scale)
            self.stats.attach()
        if every and optimizer is not None:
            self.updates = UpdateUnderflowMeter(model, optimizer, every=every, scale_fn=policy.loss_scale)
            self.updates.attach()
        # The injector counts training forward passes itself (data position), so a guard rollback
        # does not replay the fault: it behaves like a bad batch that the rollback skips.
        if settings.inject and settings.inject_rank in (-1, self.parallel.rank):
            self.injector = FaultInjector(model, settings.inject)
            self.injector.attach()

    def arm_locator(self) -> bool:
        """Attach the non-finite locator now, if it is not attached yet (a framework callback arms it
        after the first skipped or non-finite step: `ampkit.integrations`); whether it was armed now."""
        if self.locator is not None:
            return False
        self.locator = NonFiniteLocator(self.model).attach()
        return True

    def at_log_step(self, step: int, metrics) -> None:
        if self.stats is not None:
            for stats in self.stats.drain():  # sync point (log steps only)
                metrics.write({"event": "grad_stats", **stats.to_dict()})
        if self.updates is not None:
            self._write_updates(metrics)
        if self.locator is None and self.inject is None:
            return
        self._gather()
        if self.first is not None and not self._reported:
            self._reported = True
            metrics.write({"event": "nonfinite", "step": step, **self.first})

    def _gather(self) -> None:
        """Every rank's finding and fired steps to every rank (a collective at log steps; free in one
        process). The first finding: the earliest step, forward before backward, a module's own values
        before a parameter's gradient (FSDP2 hands it over reduce-scattered, carrying the other ranks'
        values), then the lowest rank (ranks run concurrently: no rank is "first" within a phase)."""
        finding = self.locator.first_nonfinite if self.locator is not None else None
        mine = finding.to_dict() if finding is not None else None
        fired = self.injector.fired if self.injector is not None else []
        gathered = self.parallel.all_gather_object((mine, list(fired)))
        self.fired = [steps for _, steps in gathered]
        found = [(_order(f), rank, f) for rank, (f, _) in enumerate(gathered) if f]
        if found and self.first is None:
            _, rank, first = min(found, key=lambda item: item[:2])
            self.first = first if len(gathered) == 1 else {"rank": rank, **first}

    def _write_updates(self, metrics) -> None:
        assert self.updates is not None
        for update in self.updates.drain():  # sync point (log steps only)
            metrics.write({"event": "update_stats", **update.to_dict()})
        for layer in self.updates.frozen:
            if layer.name not in self._frozen_reported:
                self._frozen_reported.add(layer.name)
                metrics.write({"event": "frozen_layer", **layer.to_dict()})

    def close(self) -> None:
        for hook in (self.locator, self.stats, self.injector, self.updates):
            if hook is not None:
                hook.detach()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.locator is not None:
            out["first_nonfinite"] = self._first_summary()
        if self.inject is not None:
            out["inject"] = self._inject_summary()
        if self.stats is not None:
            out["grad_stats_every"] = self.stats.every
        if self.updates is not None:
            out["frozen_layers"] = [layer.to_dict() for layer in self.updates.frozen]
        return out

    def _first_summary(self) -> dict[str, Any] | None:
        """The gathered first finding without its frames; this rank's own when the run ended before a
        log step gathered it (an error: the ranks may not meet again)."""
        first = self.first
        if first is None and self.locator is not None and self.locator.first_nonfinite is not None:
            first = self.locator.first_nonfinite.to_dict()
            first = first if self.parallel.world_size == 1 else {"rank": self.parallel.rank, **first}
        return {k: v for k, v in first.items() if k != "frames"} if first is not None else None

    def _inject_summary(self) -> dict[str, Any]:
        assert self.inject is not None
        spec = str(self.injector.spec) if self.injector is not None else self.inject["spec"]
        if self.parallel.world_size == 1:
            return {"spec": spec, "fired_steps": self.injector.fired if self.injector is not None else []}
        fired = {str(rank): steps for rank, steps in enumerate(self.fired)}  # as gathered at the last log step
        return {"spec": spec, "rank": self.inject["rank"], "fired_steps": fired}


def build_train_diagnostics(objs, settings: GuardSection, *, micro_batches: int) -> TrainDiagnostics | NoDiagnostics:
    """The diagnostics the `[guard]` section asks for, attached to `objs.model` (DDP's wrapped module);
    `NoDiagnostics` when none. A fault's rank past the job's is a UsageError (on every rank)."""
    if not settings.diagnostics:
        return NoDiagnostics()
    parallel = objs.parallel
    check_inject_rank(settings.inject_rank, inject=settings.inject, world_size=parallel.world_size)
    return TrainDiagnostics(
        unwrap(objs.model),
        objs.policy,
        settings,
        micro_batches=micro_batches,
        optimizer=objs.optimizer,
        parallel=parallel,
    )
