"""The traced memory ledger: one real training step of the actual ampkit model on fake tensors.

`FakeTensorMode` gives every tensor a shape, dtype and device but no storage, so a 1B-parameter
step runs on a laptop without allocating its memory. The step is `ampkit train`'s: the model from
`ampkit.models`, the precision policy's `convert_module` / `forward_context` / `backward` /
`unscale_gradients` / `optimizer_step`, gradient clipping, and the optimizer `ampkit train` builds
(fused AdamW; or SGD, or bitsandbytes AdamW8bit when installed). `StorageTracker` files every
storage under a ledger line and records the lines at the peak.

Steady state: the optimizer's states are created by a warm-up step before tracking (their first
creation happens after the peak of step 1, so step 2 onwards is what a run lives with). With
grad_accum > 1 the warm-up leaves gradients allocated, as a later micro-batch finds them.

fp8-emulated traces too (torchao's float8 conversion with emulation); native fp8 does not.
Two deliberate differences from a CUDA step, both documented in docs/plan.md: the fake tensors are
CPU tensors, so SDPA takes the CPU flash kernel (which saves the same output + logsumexp as CUDA
flash attention), and GradScaler's skip decision (`.item()` on a fake tensor cannot be answered) is
replaced by stepping the optimizer directly, which allocates the same.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ampkit.core import Trainer
from ampkit.core.step import forward_loss, lm_count
from ampkit.data import Batch
from ampkit.errors import UsageError
from ampkit.models import LlamaLM
from ampkit.plan.describe import ModelDescription
from ampkit.plan.numerics import get_numerics
from ampkit.plan.optim import build_optimizer
from ampkit.plan.setting import DEFAULT_RESERVE, Ledger, Reserve, StepSetting
from ampkit.plan.traced.tracker import StorageTracker
from ampkit.precision import Precision, build_precision
from ampkit.precision.lowbit import LowBitPrecision


def trace_blocker(desc: ModelDescription, setting: StepSetting) -> str | None:
    """Why the traced engine cannot run this configuration (None: it can)."""
    if not desc.buildable:
        return f"ampkit does not build {desc.family} models with this shape"
    if not get_numerics(setting.precision).traceable:
        return "native fp8 does not trace on CPU (fp8-emulated traces the same recipe)"
    if setting.world_size > 1:
        return "--world-size > 1 is analytic only"
    return None


def check_traceable(desc: ModelDescription, setting: StepSetting) -> None:
    """Refuse what the traced engine cannot run, with the fix."""
    why = trace_blocker(desc, setting)
    if why is not None:
        raise UsageError(f"cannot trace: {why}; drop --trace for the analytic ledger")


def materialize_fake(model: nn.Module) -> None:
    """Replace every parameter (built on the meta device) by a fake CPU tensor of the same shape
    and dtype, keeping tied parameters tied. Call inside FakeTensorMode."""
    fresh: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in fresh:
                fresh[id(param)] = nn.Parameter(
                    torch.empty(param.shape, dtype=param.dtype), requires_grad=param.requires_grad
                )
            module._parameters[name] = fresh[id(param)]


def checkpoint_blocks(model: LlamaLM, tracker: StorageTracker) -> None:
    """Full activation checkpointing: every block keeps only its inputs and recomputes its
    activations in backward (non-reentrant `torch.utils.checkpoint`). Recomputed tensors are filed
    as activations."""
    for block in model.blocks:
        block.forward = functools.partial(_checkpointed, block.forward, tracker)


def _checkpointed(forward, tracker: StorageTracker, *args):
    def run(*inner):
        with tracker.phase_as("activations"):
            return forward(*inner)

    return checkpoint(run, *args, use_reentrant=False)


def _build(desc: ModelDescription, policy: Precision) -> LlamaLM:
    assert desc.model_config is not None, "check_traceable refuses the models ampkit does not build"
    with torch.device("meta"):  # no memory: shapes only, then the policy's dtype conversion
        model = LlamaLM(desc.model_config)
    converted = convert_for_trace(policy, model)
    assert isinstance(converted, LlamaLM), "the policies convert a model in place"
    return converted


def convert_for_trace(policy: Precision, model: nn.Module) -> nn.Module:
    """`policy.convert_module(model)` for a fake-tensor trace. torchao's float8 conversion also patches
    inductor's Triton code generation for compiled float8 kernels, which imports inductor (~0.4 s of
    CPU); a trace compiles nothing, so that patch is held off here (the next conversion of a model
    that runs applies it) and the converted modules are the same."""
    if not isinstance(policy, LowBitPrecision):
        return policy.convert_module(model)
    try:
        from torchao.float8 import _inductor_patch as patch
    except ImportError:  # no torchao (convert_module says how to install it) or the patch moved
        return policy.convert_module(model)
    apply = getattr(patch, "_patch_inductor_min_max_codegen", None)
    patch._patch_inductor_min_max_codegen = lambda: None
    try:
        return policy.convert_module(model)
    finally:
        if apply is None:
            del patch._patch_inductor_min_max_codegen
        else:
            patch._patch_inductor_min_max_codegen = apply


def _warm_up(model: nn.Module, optimizer: torch.optim.Optimizer, *, keep_grads: bool) -> None:
    """Create the optimizer states as step 1 leaves them (zero gradients, one step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    if not keep_grads:
        optimizer.zero_grad(set_to_none=True)


def steady_state_optimizer(
    model: nn.Module, setting: StepSetting, tracker: StorageTracker, fake: contextlib.AbstractContextManager
) -> torch.optim.Optimizer:
    """The run's optimizer over `model`'s fake parameters (materialised inside `fake` beforehand) in
    its steady state: its states created by a warm-up step (`_warm_up`), then the parameters, any
    kept gradients and the states filed under their ledger lines (`_tag_state`)."""
    optimizer = build_optimizer(setting.optimizer, model)  # no tensors made: safe outside fake mode
    with fake:
        _warm_up(model, optimizer, keep_grads=setting.grad_accum > 1)
        _tag_state(tracker, model, optimizer)
    return optimizer


def random_batch(vocab_size: int, setting: StepSetting, *, generator: torch.Generator | None = None) -> Batch:
    """A (micro_batch, seq_len) batch of random token ids and targets, every slot a real token.
    `generator`: seeded draws for a real step; a fake step's values do not matter."""
    shape = (setting.micro_batch, setting.seq_len)
    ids = torch.randint(0, vocab_size, shape, generator=generator)
    targets = torch.randint(0, vocab_size, shape, generator=generator)
    return Batch(input_ids=ids, targets=targets, n_tokens=setting.tokens, n_padded=setting.tokens)


def fake_batch(vocab_size: int, setting: StepSetting, tracker: StorageTracker) -> Batch:
    """`random_batch` filed as activations (the batch lives to the step's end); call inside FakeTensorMode."""
    batch = random_batch(vocab_size, setting)
    for tensor in (batch.input_ids, batch.targets):
        tracker.tag(tensor, "activations")
    return batch


def tag_state(tracker: StorageTracker, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """File what exists before the step: the parameters, any kept gradients, the optimizer's states."""
    for p in model.parameters():
        tracker.tag(p, "parameters")
        if p.grad is not None:
            tracker.tag(p.grad, "gradients")
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                tracker.tag(value, "optimizer_states")


def file_new_gradients(model: nn.Module, tracker_of: Callable[[], StorageTracker]) -> None:
    """File each gradient under gradients as it lands on its parameter, in the tracker `tracker_of()`
    names then (a frozen weight, a LoRA base, gets none)."""
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda param: tracker_of().tag(param.grad, "gradients"))


def _tag_state(tracker: StorageTracker, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    tag_state(tracker, model, optimizer)
    file_new_gradients(model, lambda: tracker)


def _install_labels(model: LlamaLM, tracker: StorageTracker) -> None:
    """Name the step's moments as the analytic replay does (for `peak_moment` and timeline
    comparisons), and switch to temporaries at the logits."""

    def label(text: str):
        return lambda *_: setattr(tracker, "label", text)

    def head_done(module, inputs, output):
        tracker.tag(output, "temporaries")  # logits: the loss region starts here
        tracker.phase, tracker.label = "temporaries", "forward: logits and loss"

    for k, block in enumerate(model.blocks):
        block.register_forward_pre_hook(label(f"forward: block {k}"))
        block.register_full_backward_pre_hook(label(f"backward: block {k}"))
    model.norm.register_forward_pre_hook(label("forward: final norm and head"))
    model.lm_head.register_forward_hook(head_done)
    model.lm_head.register_full_backward_pre_hook(label("backward: output head"))
    model.norm.register_full_backward_pre_hook(label("backward: final norm"))

    # the embedding's input (token ids) needs no gradient, so a module backward hook would not
    # fire cleanly; a hook on its output's gradient marks the same moment
    def mark_embedding_backward(module, inputs, output) -> None:
        if output.requires_grad:  # a frozen embedding (LoRA) has no backward
            output.register_hook(label("backward: embedding"))

    model.embed.register_forward_hook(mark_embedding_backward)


class _TrackerPhases:
    """The training step's phase hooks, filing what each phase allocates under its ledger label."""

    def __init__(self, tracker: StorageTracker):
        self.tracker = tracker

    def enter(self, phase: str) -> None:
        if phase == "backward":
            self.tracker.phase, self.tracker.label = "temporaries", "backward: loss"
        else:
            self.tracker.label = "optimizer step"


class _FakeModePolicy:
    """The run's policy, except that GradScaler's skip decision (`.item()` on a fake tensor, which
    cannot be answered) is replaced by stepping the optimizer, which allocates the same."""

    def __init__(self, policy: Precision):
        self._policy = policy

    def convert_input(self, batch: Any) -> Any:
        return self._policy.convert_input(batch)

    def forward_context(self) -> contextlib.AbstractContextManager:
        return self._policy.forward_context()

    def backward(self, loss: torch.Tensor) -> None:
        self._policy.backward(loss)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        self._policy.unscale_gradients(optimizer)

    def loss_scale(self) -> float | None:
        return self._policy.loss_scale()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        from torch._subclasses.fake_tensor import DataDependentOutputException

        try:
            return self._policy.optimizer_step(optimizer)
        except DataDependentOutputException:
            optimizer.step()
            return True


class _OneBatch:
    """A sampler of one (fake) batch, and a schedule that does nothing: one step is traced."""

    def __init__(self, batch: Batch):
        self.batch = batch

    def next_batch(self) -> Batch:
        return self.batch

    def step(self) -> None:
        """The LR schedule allocates nothing."""


def _train_step(
    model: nn.Module,
    policy: Precision,
    optimizer: torch.optim.Optimizer,
    tracker: StorageTracker,
    batch,
    *,
    loss_fn=forward_loss,
    count_fn=lm_count,
) -> None:
    """`ampkit.core.Trainer.train_step` itself, for one micro-batch, with the tracker's phase labels;
    `loss_fn`/`count_fn` are the task's (the language model's by default)."""
    stream = _OneBatch(batch)
    trainer = Trainer(
        model=model,
        policy=_FakeModePolicy(policy),
        optimizer=optimizer,
        scheduler=stream,
        sampler=stream,
        device=torch.device("cpu"),
        grad_accum=1,
        clip_grad_norm=1.0,
        phases=_TrackerPhases(tracker),
        loss_fn=loss_fn,
        count_fn=count_fn,
    )
    trainer.train_step()


def trace_step(desc: ModelDescription, setting: StepSetting, *, model: LlamaLM | None = None) -> StorageTracker:
    """Run one steady-state training step on fake tensors; return the tracker with its figures.
    `model`: a meta-device model to trace instead of `desc`'s (a LoRA model: `ampkit.plan.lora.ledger`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    check_traceable(desc, setting)
    policy = build_precision(setting.precision, device_type="cpu")
    model = model if model is not None else _build(desc, policy)
    tracker = StorageTracker()
    # bitsandbytes keeps two small real lookup tables (built at construction, where fake tensors
    # cannot answer .tolist()): let them in as constants
    fake = FakeTensorMode(allow_non_fake_inputs=setting.optimizer == "adamw-8bit")
    with fake:
        materialize_fake(model)
    optimizer = steady_state_optimizer(model, setting, tracker, fake)
    with fake:
        _install_labels(model, tracker)
        if setting.checkpointing == "full":
            checkpoint_blocks(model, tracker)
        batch = fake_batch(desc.vocab_size, setting, tracker)
        with policy.run_context(), tracker:
            _train_step(model, policy, optimizer, tracker, batch)
    return tracker


def traced_ledger(desc: ModelDescription, setting: StepSetting, *, reserve: Reserve = DEFAULT_RESERVE) -> Ledger:
    """The step's memory as measured on fake tensors; same lines and reserve as the analytic one."""
    return tracker_ledger(trace_step(desc, setting), setting, reserve)


def tracker_ledger(tracker: StorageTracker, setting: StepSetting, reserve: Reserve) -> Ledger:
    """The traced ledger of a tracked step (any traced engine's): the lines live at the tracker's
    peak, each line's largest, and the framework reserve on top of that peak."""
    lines, largest = tracker.peak_lines, tracker.largest
    return Ledger.of_peak(setting, "traced", lines=lines, largest=largest, moment=tracker.peak_label, reserve=reserve)


def checkpoint_task_blocks(blocks: list[nn.Module], tracker: StorageTracker) -> None:
    """Full activation checkpointing of the task's repeated blocks; recomputed tensors are activations."""

    def wrap(forward):
        def run(*args, **kwargs):
            def inner(*a, **k):
                with tracker.phase_as("activations"):
                    return forward(*a, **k)

            return checkpoint(inner, *args, use_reentrant=False, **kwargs)

        return run

    for block in blocks:
        block.forward = wrap(block.forward)
