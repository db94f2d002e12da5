"""What `ampkit train` attaches for `--detect-nonfinite`, `--grad-stats-every N` and `--inject`.

`--grad-stats-every N` attaches two meters: the gradient statistics and the update-underflow meter
(`ampkit.diagnostics.underflow`: updates lost to rounding, layers frozen), written to metrics.jsonl as
"grad_stats", "update_stats" and (once per layer) "frozen_layer" records.

All three are hooks on the model; the loop calls `begin_step(step)` before a step and
`at_log_step(step, metrics)` at log steps, where the gradient statistics are moved to the host
(their only sync) and a new non-finite finding is written to metrics.jsonl. With everything off,
`build_train_diagnostics` returns `NoDiagnostics`, which does nothing and places no hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampkit.diagnostics.gradstats import GradientStatistics
from ampkit.diagnostics.inject import FaultInjector
from ampkit.diagnostics.locator import NonFiniteLocator
from ampkit.diagnostics.underflow import UpdateUnderflowMeter

if TYPE_CHECKING:
    from ampkit.sections import GuardSection


class NoDiagnostics:
    """Every diagnostic off: no hooks, no cost."""

    def begin_step(self, step: int) -> None:
        """Nothing to arm."""

    def at_log_step(self, step: int, metrics) -> None:
        """Nothing to report."""

    def close(self) -> None:
        """Nothing attached."""

    def summary(self) -> dict[str, Any]:
        return {}


class TrainDiagnostics:
    """The enabled diagnostics of one run (any of locator, gradient statistics, fault injector)."""

    def __init__(self, model, policy, settings: GuardSection, *, micro_batches: int, optimizer=None):
        """Attach to `model` what the run's `[guard]` section turns on; `micro_batches`: per optimizer
        step; `optimizer` lets the update-underflow meter see what each step changed."""
        every = settings.grad_stats_every
        self.locator = NonFiniteLocator(model).attach() if settings.detect_nonfinite else None
        self.stats = (
            GradientStatistics(model, every=every, micro_batches=micro_batches, scale_fn=policy.loss_scale).attach()
            if every
            else None
        )
        self.updates = (
            UpdateUnderflowMeter(model, optimizer, every=every, scale_fn=policy.loss_scale).attach()
            if every and optimizer is not None
            else None
        )
        self._frozen_reported: set[str] = set()
        # The injector counts training forward passes itself (data position), so a guard rollback
        # does not replay the fault: it behaves like a bad batch that the rollback skips.
        self.injector = FaultInjector(model, settings.inject).attach() if settings.inject else None
        self._reported = False

    def begin_step(self, step: int) -> None:
        if self.locator is not None:
            self.locator.begin_step(step)
        if self.stats is not None:
            self.stats.begin_step(step)
        if self.updates is not None:
            self.updates.begin_step(step)

    def at_log_step(self, step: int, metrics) -> None:
        if self.stats is not None:
            for stats in self.stats.drain():  # sync point (log steps only)
                metrics.write({"event": "grad_stats", **stats.to_dict()})
        if self.updates is not None:
            self._write_updates(metrics)
        if self.locator is not None and self.locator.first_nonfinite is not None and not self._reported:
            self._reported = True
            metrics.write({"event": "nonfinite", "step": step, **self.locator.first_nonfinite.to_dict()})

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
            finding = self.locator.first_nonfinite
            out["first_nonfinite"] = finding.to_dict(frames=False) if finding else None
        if self.injector is not None:
            out["inject"] = {"spec": str(self.injector.spec), "fired_steps": self.injector.fired}
        if self.stats is not None:
            out["grad_stats_every"] = self.stats.every
        if self.updates is not None:
            out["frozen_layers"] = [layer.to_dict() for layer in self.updates.frozen]
        return out


def build_train_diagnostics(objs, settings: GuardSection, *, micro_batches: int) -> TrainDiagnostics | NoDiagnostics:
    """The diagnostics the `[guard]` section asks for, attached to `objs.model`; `NoDiagnostics` when none."""
    if not settings.diagnostics:
        return NoDiagnostics()
    return TrainDiagnostics(objs.model, objs.policy, settings, micro_batches=micro_batches, optimizer=objs.optimizer)
