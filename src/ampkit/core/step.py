"""One optimizer step, done right for every precision, and held-out evaluation.

This is the only code that runs backward -> unscale -> clip -> optimizer step -> schedule; train,
bench, doctor, the smoke test and the planner's traced step all call `Trainer.train_step`.
The step never branches on dtype: precision behaviour lives in the policy object.
    policy.convert_input(batch)                     (a -true regime's inputs in its dtype; `policy_loss`)
    forward + loss under policy.forward_context()   (autocast wraps nothing else; `loss_fn`)
    policy.backward                                 (scales the loss when a scaler is active)
    policy.unscale_gradients -> clip                (clipping sees true-scale gradients)
    gate.allows(grad_norm)                          (do-nothing by default; diagnostics may skip)
    policy.optimizer_step -> bool                   (False when the scaler skipped the step)
    scheduler.step() only if the optimizer stepped
No `.item()` here: results stay on the device until the caller logs them (the optional
`StepIfFinite` gate is the one exception, and says so).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from ampkit.core.counts import Counts, as_counts, sum_counts
from ampkit.core.optim import build_optimizer
from ampkit.core.parallel import LocalRun
from ampkit.core.schedule import build_scheduler
from ampkit.models import causal_lm_loss

if TYPE_CHECKING:
    from ampkit.data import Batch

LossFn = Callable[[nn.Module, Any], tuple[torch.Tensor, torch.Tensor]]
"""`loss_fn(model, batch) -> (loss, outputs)`: the mean loss over the batch's items (0-d, fp32) and
the model's outputs (for metrics such as the smoke test's accuracy). Called by `policy_loss`: on the
batch as the policy converted it, inside the policy's forward context."""


CountFn = Callable[[Any], Counts | tuple[int, int]]
"""`count_fn(batch) -> Counts`: the items the loss covers (trained tokens, samples), the items read
(processed: masked ones too) and the slots computed (padding included); host ints, no device sync.
An older task's `(items, slots)` pair is read by `as_counts` (`ampkit.core.counts`)."""


def lm_count(batch: Batch) -> Counts:
    """A causal-LM batch trains its targets with a loss, reads its non-padding ones, computes all slots."""
    return Counts(trained=batch.n_tokens, processed=batch.processed, slots=batch.n_padded)


def forward_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward-and-loss of a causal-LM batch, written once: (mean next-token loss, logits).

    `batch` is an `ampkit.data.Batch` on the model's device; the loss is computed in fp32 whatever
    the logits' dtype (`causal_lm_loss` upcasts)."""
    logits = model(batch.input_ids, positions=batch.positions, attn_mask=batch.attn_mask)
    return causal_lm_loss(logits, batch.targets), logits


class StepPolicy(Protocol):
    """What the step asks of a precision policy: `ampkit.precision.Precision` and its regimes (or a
    wrapper around one, such as the planner's fake-tensor policy)."""

    def convert_input(self, batch: Any) -> Any: ...

    def forward_context(self) -> contextlib.AbstractContextManager: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None: ...

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool: ...

    def loss_scale(self) -> float | None: ...


def policy_loss(policy: StepPolicy, loss_fn: LossFn, model: nn.Module, batch: Any) -> tuple[torch.Tensor, Any]:
    """`loss_fn(model, batch)` as the step runs it: the batch converted by the policy (`convert_input`:
    floating inputs in a -true regime's dtype), then forward and loss under its forward context. The
    one way a batch enters a model: the Trainer, the first-batch check, the compile warm-up, bench's
    fidelity capture, doctor's smoke replay and layer fidelity all call it. `batch` is on the device."""
    batch = policy.convert_input(batch)
    with policy.forward_context():
        return loss_fn(model, batch)


class BatchSource(Protocol):
    """Where the step's micro-batches come from: `ampkit.data.BatchSampler`, a task's stream, or any
    object whose `next_batch()` returns a batch with `.to(device)`."""

    def next_batch(self) -> Any: ...


class Schedule(Protocol):
    """The LR schedule the step advances after a real optimizer step: a torch LRScheduler (the one
    `build_scheduler` makes), or the planner's do-nothing stand-in."""

    def step(self) -> None: ...


ScheduleT = TypeVar("ScheduleT", bound=Schedule)


class Phases(Protocol):
    """Observer told when the step enters its backward and optimizer phases."""

    def enter(self, phase: str) -> None: ...


@dataclass
class StepResult:
    loss: torch.Tensor
    """token-weighted mean loss over the step's micro-batches (0-d, fp32, on device); data-parallel:
    this rank's share, whose mean over ranks is the global batch's loss"""
    grad_norm: torch.Tensor
    """global gradient norm after unscaling, before clipping (0-d, on device)"""
    n_tokens: int
    """items the step's loss covers, all ranks: real (non-padding) target tokens for a language
    model, samples for a classifier (the task's unit; the name is kept from the LM-only days)"""
    n_slots: int
    """all slots computed, padding included (all ranks)"""
    n_processed: int
    """items the model read, masked ones included, padding not (all ranks): what MFU counts"""
    stepped: bool
    """False when the optimizer step was skipped (the loss scaler found inf/nan, or the gate said no)"""
    n_image_tokens: int = 0
    """the processed items that stand for images (a VLM's image tokens; `Counts.image_tokens`)"""


def clip_gradients(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients; scales them down to `max_norm` when it is > 0."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


class StepAlways:
    """The default gate: every step goes to the policy (which may still skip it: the scaler)."""

    def allows(self, grad_norm: torch.Tensor, policy: StepPolicy) -> bool:
        return True


class StepIfFinite:
    """Diagnostics' gate: without a loss scaler nothing would stop non-finite gradients from
    reaching the weights, so skip such a step (the weights stay the ones that produced it, for a
    replay). With a scaler the scaler decides. A host sync per step: diagnostics only."""

    def allows(self, grad_norm: torch.Tensor, policy: StepPolicy) -> bool:
        return policy.loss_scale() is not None or math.isfinite(grad_norm.item())  # sync point


class NoPhases:
    """Phase observer that does nothing (the planner's tracer labels memory by phase instead)."""

    def enter(self, phase: str) -> None:
        """`phase` is "backward" or "optimizer"."""


class Trainer(Generic[ScheduleT]):
    """Holds the run's objects; `train_step()` does one optimizer step of `grad_accum` micro-batches.
    Generic in its schedule's type, so a caller of `build_trainer` keeps its LambdaLR's type."""

    def __init__(
        self,
        *,
        model: nn.Module,
        policy: StepPolicy,
        optimizer: torch.optim.Optimizer,
        scheduler: ScheduleT,
        sampler: BatchSource,
        device: torch.device,
        grad_accum: int,
        clip_grad_norm: float,
        parallel: LocalRun | None = None,
        loss_fn: LossFn = forward_loss,
        count_fn: CountFn = lm_count,
        gate: StepAlways | StepIfFinite | None = None,
        phases: Phases | None = None,
    ) -> None:
        self.model, self.policy, self.optimizer, self.scheduler = model, policy, optimizer, scheduler
        # Data-parallel hooks (ampkit.distributed): a do-nothing object in a one-process run.
        self.parallel = parallel if parallel is not None else LocalRun()
        self.sampler, self.device = sampler, device
        self.grad_accum, self.clip_grad_norm = grad_accum, clip_grad_norm
        self.loss_fn, self.count_fn = loss_fn, count_fn
        self.gate = gate if gate is not None else StepAlways()
        self.phases: Phases = phases if phases is not None else NoPhases()
        self.params = [p for p in model.parameters() if p.requires_grad]

    def train_step(self) -> StepResult:
        self.model.train()
        batches = [self.sampler.next_batch().to(self.device) for _ in range(self.grad_accum)]
        counts = [as_counts(self.count_fn(b)) for b in batches]
        # Counts over every rank's micro-batches (host ints, no sync): the step's global batch.
        step = self.parallel.step_counts(sum_counts(counts))
        n_tokens = step.trained
        world = self.parallel.world_size
        total_loss = torch.zeros((), device=self.device)
        for i, (batch, count) in enumerate(zip(batches, counts)):
            items = count.trained
            with self.parallel.micro_batch_context(last=i == len(batches) - 1):  # DDP: all-reduce on the last only
                # The outputs (logits) are dropped here, before backward: autograd keeps what backward
                # needs (the LM loss saves the logits until its own backward), so holding them would
                # only add B*T*V of memory through the rest of backward and the optimizer step (the
                # planner's ledgers free `h.logits` at the loss's backward: plan/analytic, plan/lora).
                loss = policy_loss(self.policy, self.loss_fn, self.model, batch)[0]
                # Weight each micro-batch by its share of the trained items (tokens with a loss, samples), so the step's
                # gradient is the per-item mean over the whole step whatever the padding of each micro-batch. DDP and
                # FSDP average gradients over ranks, hence the factor `world` (1 in one process).
                weight = items * world / max(1, n_tokens)
                self.phases.enter("backward")
                self.policy.backward(loss * weight)
            total_loss += loss.detach() * weight
        self.phases.enter("optimizer")
        self.policy.unscale_gradients(self.optimizer)
        grad_norm = clip_gradients(self.params, self.clip_grad_norm)
        stepped = self.gate.allows(grad_norm, self.policy) and self.policy.optimizer_step(self.optimizer)
        if stepped:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(
            loss=total_loss,
            grad_norm=grad_norm,
            n_tokens=n_tokens,
            n_slots=step.slots,
            n_processed=step.processed,
            stepped=stepped,
            n_image_tokens=step.image_tokens,
        )

    @torch.no_grad()
    def evaluate(self, batches: Iterable[Any]) -> float:
        """Per-item mean loss over held-out batches (a host sync: call it at eval steps only)."""
        self.model.eval()
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        count = 0
        for batch in batches:
            batch = batch.to(self.device)
            loss, _ = policy_loss(self.policy, self.loss_fn, self.model, batch)
            items = as_counts(self.count_fn(batch)).trained
            total += loss.double() * items
            count += items
        self.model.train()
        return total.item() / count if count else math.nan


def build_trainer(
    model: nn.Module,
    policy: StepPolicy,
    sampler: BatchSource,
    *,
    device: torch.device,
    optimizer: str,
    lr: float,
    weight_decay: float,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float,
    clip_grad_norm: float,
    grad_accum: int = 1,
    **step_options: Any,
) -> Trainer[torch.optim.lr_scheduler.LambdaLR]:
    """The optimizer `optimizer` over `model` (`build_optimizer`), its warmup-then-cosine schedule
    (`build_scheduler`) and the Trainer that steps them; `step_options` (parallel, loss_fn, count_fn,
    gate, phases) go to `Trainer` as they are. Its `optimizer` and `scheduler` are the built ones."""
    built = build_optimizer(model, name=optimizer, lr=lr, weight_decay=weight_decay)
    scheduler = build_scheduler(built, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio)
    return Trainer(
        model=model,
        policy=policy,
        optimizer=built,
        scheduler=scheduler,
        sampler=sampler,
        device=device,
        grad_accum=grad_accum,
        clip_grad_norm=clip_grad_norm,
        **step_options,
    )
