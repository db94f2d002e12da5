"""ampkit's callback for Lightning (`lightning.pytorch.Trainer`; docs/integrations.md).

    from ampkit.integrations.lightning import AmpkitCallback
    trainer = L.Trainer(precision="bf16-mixed", callbacks=[AmpkitCallback(out="runs/cb")])
    trainer.fit(module, data)          # runs/cb/summary.json, metrics.jsonl, report.html

Lightning hands its hooks the Trainer, so the loss scale needs no attaching: 16-mixed's GradScaler is
`trainer.precision_plugin.scaler`. A step counts as skipped when that scale fell (torch's GradScaler
halves it exactly when it skips). lightning is imported when this module is, never by `import ampkit`.
"""

from __future__ import annotations

from typing import Any

import lightning
from lightning.pytorch.callbacks import Callback

from ampkit.integrations.session import Monitor, MonitorSettings, Subject


def _loss_of(outputs: Any) -> Any:
    """training_step's loss: a tensor, or a dict's "loss" (None when the step returned none)."""
    return outputs.get("loss") if isinstance(outputs, dict) else outputs


class AmpkitCallback(Callback):
    """Watch a Lightning run: the device/precision check before the first step, the non-finite
    locator, gradient statistics and the update-underflow meter, the loss-scale trajectory, and an
    ampkit run directory at the end. Keyword arguments: `MonitorSettings`."""

    def __init__(self, **settings: Any):
        self.monitor = Monitor(MonitorSettings(**settings))
        self._begun_step = 0

    @property
    def run_dir(self):
        return self.monitor.run_dir

    def on_train_start(self, trainer, pl_module) -> None:
        optimizers = trainer.optimizers
        subject = Subject(
            model=pl_module,
            optimizer=optimizers[0] if len(optimizers) == 1 else None,  # several: no underflow meter
            precision=str(trainer.precision),
            device=pl_module.device,
            framework="lightning",
            framework_version=lightning.__version__,
            micro_batches=trainer.accumulate_grad_batches,
        )
        self.monitor.begin(subject, scaler_fn=lambda: getattr(trainer.precision_plugin, "scaler", None))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step + 1
        if step != self._begun_step:  # the first micro-batch of an optimizer step
            self._begun_step = step
            self.monitor.begin_step(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step != self._begun_step:  # still accumulating: no optimizer step yet
            return
        self.monitor.end_step(step)
        if self.monitor.is_log_step(step) or step == trainer.max_steps:
            self.monitor.log(step, loss=_loss_of(outputs))

    def on_train_end(self, trainer, pl_module) -> None:
        self.monitor.end()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.monitor.end(status="stopped", error=f"{type(exception).__name__}: {exception}")
