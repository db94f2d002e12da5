"""ampkit's callback for the Hugging Face `transformers.Trainer` (docs/integrations.md).

    from ampkit.integrations.transformers import AmpkitCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[AmpkitCallback(out="runs/cb")])
    trainer.train()          # runs/cb/summary.json, metrics.jsonl, report.html

A `TrainerCallback` is handed the model and the optimizer, never the Trainer: the loss scale (fp16 on
a GPU: accelerate's GradScaler, `trainer.accelerator.scaler`) and whether a step was skipped are the
Trainer's. `attach(trainer, ...)` (or `AmpkitCallback.attach(trainer)`) gives the callback its Trainer
and adds it; without one, the trajectory infers nothing and says the scale is unknown (no scaler).

transformers is imported when this module is: `import ampkit` never needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import transformers
from transformers import TrainerCallback

from ampkit.integrations.session import Monitor, MonitorSettings, Subject

# accelerate makes neither autocast nor a GradScaler for fp16 on the CPU ("native_amp" is False there),
# so TrainingArguments(fp16=True, use_cpu=True) trains in fp32; said, since the flag says otherwise.
CPU_FP16_NOTE = (
    "transformers' fp16=True does nothing on the CPU: accelerate makes no fp16 autocast and no GradScaler there, "
    "so this run trains in fp32; use bf16=True for mixed precision on a CPU"
)


def precision_of(args: Any, model: Any) -> str:
    """The ampkit precision of a Trainer's `TrainingArguments` and model: the fp16/bf16 flags (autocast:
    *-mixed), else the weights' own dtype (a model loaded in bf16 trains bf16-true), else fp32 or tf32."""
    if args.fp16:
        return "fp16-mixed"
    if args.bf16:
        return "bf16-mixed"
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    dtype = str(first.dtype) if first is not None else ""
    if dtype.endswith("bfloat16"):
        return "bf16-true"
    if dtype.endswith("float16"):
        return "fp16-true"
    return "tf32" if args.tf32 else "fp32"


def _inner(optimizer: Any) -> Any:
    """accelerate's AcceleratedOptimizer wraps the torch optimizer that steps (its `.optimizer`)."""
    return getattr(optimizer, "optimizer", optimizer)


class AmpkitCallback(TrainerCallback):
    """Watch a `transformers.Trainer` run: the device/precision check before the first step, the
    non-finite locator, gradient statistics and the update-underflow meter, the loss-scale trajectory
    (with `attach`), and an ampkit run directory at the end. Keyword arguments: `MonitorSettings`."""

    def __init__(self, **settings: Any):
        self.monitor = Monitor(MonitorSettings(**settings))
        self.trainer: Any = None

    @classmethod
    def attach(cls, trainer: Any, **settings: Any) -> AmpkitCallback:
        """A callback that knows `trainer` (its GradScaler, its skipped steps), added to it."""
        callback = cls(**settings)
        callback.trainer = trainer
        trainer.add_callback(callback)
        trainer.train = callback._ending_on_exceptions(trainer.train)
        return callback

    def _ending_on_exceptions(self, train: Callable[..., Any]) -> Callable[..., Any]:
        """`trainer.train` wrapped: transformers calls no callback when it raises, so the run directory is
        written here ("stopped" for Ctrl-C, else "failed", the error named) before the exception goes on."""

        @functools.wraps(train)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            try:
                return train(*args, **kwargs)
            except BaseException as exc:
                status = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
                self.monitor.end(status=status, error=f"{type(exc).__name__}: {exc}")
                raise

        return wrapped

    @property
    def run_dir(self):
        return self.monitor.run_dir

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        accelerator = getattr(self.trainer, "accelerator", None)
        ignored = args.fp16 and args.device.type == "cpu" and not getattr(accelerator, "native_amp", False)
        subject = Subject(
            model=model,
            optimizer=_inner(optimizer),
            precision=precision_of(args, model),
            device=args.device,
            framework="transformers",
            framework_version=transformers.__version__,
            micro_batches=args.gradient_accumulation_steps,
            notes=(CPU_FP16_NOTE,) if ignored else (),
        )
        self.monitor.begin(subject, scaler_fn=lambda: getattr(accelerator, "scaler", None))

    def on_step_begin(self, args, state, control, **kwargs):
        self.monitor.begin_step(state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        # accelerate's flag misses the skips of an optimizer whose step takes the scaler itself (fused
        # AdamW, `_step_supports_amp_scaling`: the default optimizer): the monitor counts a fallen scale too
        accelerator = getattr(self.trainer, "accelerator", None)
        skipped = bool(accelerator.optimizer_step_was_skipped) if accelerator is not None else None
        self.monitor.end_step(state.global_step, skipped=skipped)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:  # training logs (evaluation's carry eval_loss)
            self.monitor.log(state.global_step, loss=logs["loss"], grad_norm=logs.get("grad_norm"))

    def on_train_end(self, args, state, control, **kwargs):
        self.monitor.end()


def attach(trainer: Any, **settings: Any) -> AmpkitCallback:
    """`AmpkitCallback.attach(trainer, **settings)`: the callback that reads the Trainer's loss scale."""
    return AmpkitCallback.attach(trainer, **settings)
