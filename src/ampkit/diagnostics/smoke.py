"""The smoke test (the seeds' 4.4): overfit 16 samples until their accuracy is 100%.

A model that cannot memorize 16 short sequences has a broken precision set-up or broken code;
finding that out takes seconds. Run it under the chosen precision and under fp32: both passing
clears the precision; fp32 passing and the other failing convicts it. A failure comes with its
diagnosis: a non-finite loss or gradient is replayed once with the non-finite locator attached
(the weights are still the ones that produced it: the check runs before the optimizer step).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ampkit.core import build_trainer
from ampkit.core.step import StepIfFinite, policy_loss
from ampkit.data import Batch
from ampkit.diagnostics.locator import Finding, NonFiniteLocator
from ampkit.errors import UsageError
from ampkit.precision import LossScaleCollapse, Precision
from ampkit.tasks import optional
from ampkit.tasks.lm import LMObjective


@dataclass(frozen=True, kw_only=True)
class SmokeConfig:
    """How to run the overfit test."""

    samples: int = field(default=16, metadata={"help": "sequences to memorize"})
    seq_len: int = field(default=32, metadata={"help": "tokens per sequence"})
    max_steps: int = field(default=200, metadata={"help": "give up after this many optimizer steps"})
    lr: float = field(default=3e-3, metadata={"help": "AdamW peak learning rate (cosine to 10%, no weight decay)"})
    clip_grad_norm: float = field(default=1.0, metadata={"help": "global grad-norm clip after unscaling"})
    max_consecutive_skips: int = field(default=8, metadata={"help": "loss-scaler skips in a row that fail the test"})
    loss_fraction: float = field(
        default=0.01,
        metadata={"help": "a task without an accuracy passes when its loss falls to this share of the first"},
    )

    def __post_init__(self):
        for name in ("samples", "seq_len", "max_steps", "max_consecutive_skips"):
            if getattr(self, name) < 1:
                raise UsageError(f"smoke {name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise UsageError(f"smoke lr must be positive, got {self.lr}")


@dataclass(kw_only=True)
class SmokeResult:
    precision: str
    passed: bool
    steps_needed: int | None
    """optimizer steps taken before the forward pass that scored 100% (None when it never did)"""
    steps_run: int
    final_accuracy: float
    final_loss: float
    skipped_steps: int
    failure: str | None
    """None, "nonfinite_loss", "nonfinite_grad", "scale_collapse", "skips" or "plateau\""""
    failure_step: int | None
    finding: Finding | None
    diagnosis: str
    accuracy: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self) | {"finding": self.finding.to_dict(frames=False) if self.finding else None}
        return out


class RepeatBatch:
    """A sampler that yields the same batch forever (the smoke test memorizes it)."""

    def __init__(self, batch: Batch):
        self.batch = batch

    def next_batch(self) -> Batch:
        return self.batch


class _AccuracyLoss:
    """The task's forward-and-loss, also keeping each forward's accuracy (a loss-only task: None)."""

    def __init__(self, task) -> None:
        self.task = task
        self.loss: torch.Tensor | None = None
        self.accuracy: torch.Tensor | None = None

    def __call__(self, model: nn.Module, batch):
        loss, outputs = self.task.loss(model, batch)
        accuracy = optional.accuracy(self.task, outputs, batch)
        self.loss = loss.detach().float()
        self.accuracy = None if accuracy is None else accuracy.detach().float()
        return loss, outputs


class _Smoke:
    """One smoke run's state; `step()` is one `Trainer.train_step` plus the pass/fail reading."""

    def __init__(self, model: nn.Module, policy: Precision, batch, config: SmokeConfig, observers: list, task):
        self.model, self.policy, self.batch, self.config, self.observers = model, policy, batch, config, observers
        self.task, self.first_loss = task, math.nan
        self.measure = _AccuracyLoss(task)
        # Cosine decay to 10%: the last few tokens are memorized only once the steps get small.
        # The gate keeps non-finite gradients out of the weights when no loss scaler would, so a
        # failure can be replayed on the weights that produced it.
        self.trainer = build_trainer(
            model,
            policy,
            RepeatBatch(batch),
            device=next(model.parameters()).device,
            optimizer="adamw",
            lr=config.lr,
            weight_decay=0.0,
            warmup_steps=0,
            total_steps=config.max_steps,
            min_lr_ratio=0.1,
            clip_grad_norm=config.clip_grad_norm,
            loss_fn=self.measure,
            count_fn=task.count,
            gate=StepIfFinite(),
        )
        self.accuracy: list[float] = []
        self.loss = math.nan
        self.skipped = self.skips_in_row = 0

    def begin(self, step: int) -> None:
        for observer in self.observers:
            observer.begin_step(step)

    def step(self, step: int) -> str | None:
        """One optimizer step; returns a failure kind or "passed" or None (keep going).

        The accuracy is read from this step's forward, at the weights before its update: 100% there
        passes (the update that follows changes nothing the result reports)."""
        self.begin(step)
        result = self.trainer.train_step()  # may raise LossScaleCollapse
        assert self.measure.loss is not None  # set by the step's forward
        measured = [self.measure.loss, result.grad_norm.float()]
        if self.measure.accuracy is not None:
            measured.append(self.measure.accuracy)
        self.loss, norm, *accuracy = torch.stack(measured).tolist()  # sync point
        if step == 1:
            self.first_loss = self.loss
        # With no accuracy (a regression task), memorized means the loss fell to `loss_fraction` of its first.
        score = accuracy[0] if accuracy else float(self.loss <= self.config.loss_fraction * self.first_loss)
        self.accuracy.append(score)
        if score >= 1.0:
            return "passed"
        if not math.isfinite(self.loss):
            return "nonfinite_loss"
        if self.policy.loss_scale() is None and not math.isfinite(norm):
            return "nonfinite_grad"
        self.skipped += not result.stepped
        self.skips_in_row = 0 if result.stepped else self.skips_in_row + 1
        return "skips" if self.skips_in_row >= self.config.max_consecutive_skips else None

    def locate(self, step: int) -> Finding | None:
        """Replay `step`'s forward and backward with the locator attached (no optimizer step)."""
        self.trainer.optimizer.zero_grad(set_to_none=True)
        with NonFiniteLocator(self.model) as locator:
            self.begin(step)
            locator.begin_step(step)
            loss, _ = policy_loss(self.policy, self.task.loss, self.model, self.batch)
            self.policy.backward(loss)
        self.trainer.optimizer.zero_grad(set_to_none=True)
        return locator.first_nonfinite or locator.first_near_max


def run_smoke_test(
    model: nn.Module,
    policy: Precision,
    batch,
    *,
    task=None,
    config: SmokeConfig | None = None,
    observers: list | None = None,
) -> SmokeResult:
    """Overfit `batch` with `model` under `policy` (the model is trained in place; pass a copy).

    `task` gives the loss, the item count and the accuracy (default: the built-in language model's
    next-token loss and token accuracy). `observers` get `begin_step(step)` before every step and
    replay (e.g. a `FaultInjector`).
    """
    config = config or SmokeConfig()
    smoke = _Smoke(model, policy, batch, config, observers or [], task or LMObjective())
    outcome, step = None, 0
    with policy.run_context():
        model.train()
        for step in range(1, config.max_steps + 1):
            try:
                outcome = smoke.step(step)
            except LossScaleCollapse:
                outcome = "scale_collapse"
            if outcome:
                break
        finding = (
            smoke.locate(step) if outcome in ("nonfinite_loss", "nonfinite_grad", "scale_collapse", "skips") else None
        )
    passed = outcome == "passed"
    failure = None if passed else (outcome or "plateau")
    result = SmokeResult(
        precision=policy.name,
        passed=passed,
        steps_needed=step - 1 if passed else None,
        steps_run=step,
        final_accuracy=smoke.accuracy[-1] if smoke.accuracy else 0.0,
        final_loss=smoke.loss,
        skipped_steps=smoke.skipped,
        failure=failure,
        failure_step=None if passed else step,
        finding=finding,
        diagnosis="",
        accuracy=smoke.accuracy,
    )
    samples = int(optional.tensors_of(batch)[0].shape[0])  # rows memorized
    by_loss = config.loss_fraction if smoke.measure.accuracy is None else None  # a task with no accuracy
    result.diagnosis = diagnose(result, samples=samples, by_loss=by_loss)
    return result


def diagnose(result: SmokeResult, *, samples: int, by_loss: float | None = None) -> str:
    """One or two sentences: what happened, and where, with the evidence. `by_loss`: the task has no
    accuracy and passes when its loss falls to this share of the first (a regression)."""
    if result.passed:
        reached = f"its loss fell to {by_loss:.0%} of the first" if by_loss else "reached 100% token accuracy"
        return f"{result.precision}: {reached} on {samples} samples after {result.steps_needed} steps"
    where = (
        f" First sign: {result.finding.explanation} (step {result.finding.step}, {result.finding.phase})."
        if result.finding
        else ""
    )
    assert result.failure is not None, "a smoke test that did not pass names its failure"
    step = result.failure_step
    texts = {
        "nonfinite_loss": f"the loss became non-finite at step {step}.",
        "nonfinite_grad": f"the gradients became non-finite at step {step} (loss {result.final_loss:.4g}).",
        "scale_collapse": f"the loss scale collapsed below min_scale at step {step}: every step overflowed.",
        "skips": f"the loss scaler skipped {result.skipped_steps} of {result.steps_run} steps, the last ones in a "
        "row: the gradients overflow fp16 at every scale tried.",
        "plateau": (
            f"the loss did not fall to {by_loss:.0%} of the first in {result.steps_run} steps "
            if by_loss
            else f"token accuracy reached only {100 * result.final_accuracy:.1f}% after {result.steps_run} steps "
        )
        + f"(loss {result.final_loss:.4g}); if fp32 passes, the precision loses what the model needs, "
        "otherwise suspect the code or the learning rate.",
    }
    return f"{result.precision}: FAILED: {texts[result.failure]}{where}"
