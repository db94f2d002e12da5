"""One training step of a transformers causal LM on fake tensors, at any depth: the traced ledger's raw data.

The engine is `plan/traced/trace.py`'s (chosen over `plan/task_plan.py`'s, which builds a task's model for
real inside `FakeTensorMode`): the model is built on the meta device (no initialisation work at
any size; transformers' init and `build_hf_model`'s causality check need real values), under the
precision policy's `init_context` (bf16-true weights are born bf16) and `convert_module` (fp8's
Float8Linear swap), wrapped in `HFCausalLM` (the module `ampkit train --model hf:PATH` trains),
its parameters and buffers replaced by fake CPU tensors, and then `ampkit.core.Trainer.train_step`
runs one steady-state step with the language model's loss (`forward_loss`), as `ampkit train`
does. Native fp8 is traced as fp8-emulated (torchao's emulation: the same recipe and memory). A
`StepRig` holds such a model in its steady state and traces any number of steps on it (every
micro-batch, sequence and checkpointing of one precision, optimizer and depth), each as a fresh
model would.

`MomentTracker` files every storage under a ledger line like `StorageTracker` and also keeps, per
moment of the step (the label: "forward: block 3", "backward: block 0", "backward: loss", ...), the
lines at that moment's own peak: the extrapolation works on those (`plan/traced/extrapolate.py`). The
backward moments are marked by tensor hooks on the modules' outputs (never module backward hooks,
which wrap outputs in views that models such as Falcon then modify in place).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ampkit.core.step import forward_loss, lm_count
from ampkit.models.hf import HFCausalLM, HFModelInfo, decoder_layers
from ampkit.plan.describe.hf import HFDescription, meta_model
from ampkit.plan.describe.layers import check_copy, config_at_depth
from ampkit.plan.optim import build_optimizer
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced.sharing import StepTrace, traced_precision
from ampkit.plan.traced.trace import (
    _train_step,
    _warm_up,
    convert_for_trace,
    fake_batch,
    file_new_gradients,
    materialize_fake,
    tag_state,
)
from ampkit.plan.traced.tracker import StorageTracker
from ampkit.precision import Precision, build_precision


class MomentTracker(StorageTracker):
    """A `StorageTracker` that also records, per label, the lines when that label's total peaked
    (`moments`) and each line's own largest value under the label (`line_peaks`)."""

    def __init__(self) -> None:
        super().__init__()
        self.moments: dict[str, tuple[int, dict[str, int]]] = {}
        self.line_peaks: dict[str, dict[str, int]] = {}

    def _change(self, line: str, delta: int, what: object) -> None:
        super()._change(line, delta, what)
        if delta > 0:
            total = sum(self.current.values())
            if total > self.moments.get(self.label, (-1, {}))[0]:
                self.moments[self.label] = (total, dict(self.current))
            peaks = self.line_peaks.setdefault(self.label, dict.fromkeys(self.current, 0))
            peaks[line] = max(peaks[line], self.current[line])

    def trace(self) -> StepTrace:
        """What the step left, as the traced engine keeps (and caches) it."""
        moments = {label: dict(lines) for label, (_, lines) in self.moments.items()}
        peaks = {label: dict(lines) for label, lines in self.line_peaks.items()}
        return StepTrace(moments=moments, largest=dict(self.largest), line_peaks=peaks)


_SAME_FIELDS = ("name", "model_type", "architecture", "vocab_size", "d_model", "n_layers", "n_heads", "tie_embeddings")
"""the `HFModelInfo` fields an `HFDescription` holds under the same name"""


def _plan_info(desc: HFDescription) -> HFModelInfo:
    """The adapter's model info for a planned (never loaded) model: counts from the description."""
    return HFModelInfo(
        **{name: getattr(desc, name) for name in _SAME_FIELDS},
        path=desc.name,
        max_seq_len=desc.max_positions,
        pretrained=False,
        total_parameters=desc.counts.total,
        embedding_parameters=desc.counts.embedding,
    )


class CopyMismatch(Exception):
    """A shallow copy of the model does not have the layers it should (the caller traces in full)."""


def build_at_depth(desc: HFDescription, depth: int, policy: Precision) -> HFCausalLM:
    """`desc`'s model with `depth` decoder layers, on the meta device, converted by the policy."""
    config = desc.hf_config if depth == desc.n_layers else config_at_depth(desc.hf_config, depth)
    with policy.init_context():  # bf16-true / fp16-true: weights born in the low-precision dtype
        model = meta_model(config, desc.name, dtype=torch.get_default_dtype())
    if depth != desc.n_layers and not check_copy(list(desc.signatures), decoder_layers(model), config):
        raise CopyMismatch(f"a {depth}-layer copy of the model does not have the layers of its first {depth}")
    adapter = HFCausalLM(model, _plan_info(desc))
    adapter.train()
    converted = convert_for_trace(policy, adapter)
    assert isinstance(converted, HFCausalLM), "the policies convert a model in place"
    return converted


def _fake_buffers(model: nn.Module) -> None:
    """Meta-device buffers (rotary frequencies, ...) as fake CPU tensors; call inside FakeTensorMode."""
    for module in model.modules():
        for name, buf in list(module._buffers.items()):
            if buf is not None and buf.device.type == "meta":
                module._buffers[name] = torch.empty(buf.shape, dtype=buf.dtype)


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    items = output if isinstance(output, (tuple, list)) else [getattr(output, "logits", output)]
    for item in items:
        if isinstance(item, torch.Tensor) and item.requires_grad:
            return item
    return None


def _on_grad(rig: _Current, output: Any, label: str) -> None:
    tensor = _first_grad_tensor(output)
    if tensor is not None:
        tensor.register_hook(lambda grad: setattr(rig.tracker, "label", label))


class _Current(Protocol):
    """What the moment hooks read: the tracker of the step being traced now."""

    tracker: MomentTracker


def install_moments(model: HFCausalLM, rig: _Current) -> None:
    """Label the step's moments in `rig.tracker`: each decoder layer forward and backward, the head and
    the loss, the embedding's backward (tensor hooks on outputs mark where a module's backward begins)."""
    hf: Any = model.hf
    embed, head = hf.get_input_embeddings(), hf.get_output_embeddings()

    def forward_label(text: str):
        def hook(*_):
            in_backward = torch._C._current_graph_task_id() != -1  # a checkpointed block recomputed
            rig.tracker.label = f"{text} recompute" if in_backward else text

        return hook

    def head_done(module, inputs, output):
        tracker = rig.tracker
        tracker.tag(output, "temporaries")  # logits: the loss region starts here
        tracker.phase, tracker.label = "temporaries", "forward: logits and loss"
        _on_grad(rig, output, "backward: output head")

    embed.register_forward_pre_hook(forward_label("forward: embedding"))
    embed.register_forward_hook(lambda m, i, out: _on_grad(rig, out, "backward: embedding"))
    for k, block in enumerate(model.blocks or []):
        block.register_forward_pre_hook(forward_label(f"forward: block {k}"))
        block.register_forward_hook(lambda m, i, out, k=k: _on_grad(rig, out, f"backward: block {k}"))
    if head is not None:
        head.register_forward_pre_hook(forward_label("forward: final norm and head"))
        head.register_forward_hook(head_done)


def _checkpointable(blocks: list[nn.Module], rig: StepRig) -> None:
    """Full activation checkpointing of `blocks` while `rig.checkpointing` is on (non-reentrant
    `torch.utils.checkpoint`, recomputed tensors filed as activations); the plain forward otherwise."""

    def wrap(forward):
        def run(*args, **kwargs):
            if not rig.checkpointing:
                return forward(*args, **kwargs)

            def inner(*a, **k):
                with rig.tracker.phase_as("activations"):
                    return forward(*a, **k)

            return checkpoint(inner, *args, use_reentrant=False, **kwargs)

        return run

    for block in blocks:
        block.forward = wrap(block.forward)


@contextlib.contextmanager
def as_on_real_tensors() -> Iterator[None]:
    """Two places where transformers cannot read fake tensors' values, answered as a real unpacked
    batch answers them:
    - packing detection: with no attention mask, transformers looks for position ids restarting
      inside a row (packed documents); it cannot read fake positions, assumes packing and builds a
      (B, 1, T, T) mask, which also keeps SDPA from its `is_causal` path. The traced batch is not
      packed (one document a row), so the answer is None, as a real batch's;
    - mixture-of-experts layers: transformers' grouped_mm path calls `torch._grouped_mm`, whose shape
      function (the kernel fake tensors run) takes bf16 only; other dtypes go through transformers'
      own fallback op, which has a shape function for every dtype and allocates the same (S, out)
      outputs and saves the same inputs."""
    patches: list[tuple[Any, str, Any]] = []
    try:
        from transformers import masking_utils

        patches.append((masking_utils, "find_packed_sequence_indices", lambda position_ids: None))
    except ImportError:  # a transformers without the mask helpers: nothing to answer
        pass
    try:
        from transformers.integrations import moe

        grouped = moe._can_use_grouped_mm
        patches.append((moe, "_can_use_grouped_mm", lambda i, w, o: w.dtype == torch.bfloat16 and grouped(i, w, o)))
    except ImportError:  # a transformers without MoE integration: nothing to adapt
        pass
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, value in patches:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


class StepRig:
    """`desc`'s model with `depth` decoder layers, built, faked and brought to its optimizer's steady
    state once, for every step traced on it (`step`): the steps of one traced precision, optimizer and
    gradient keeping at any micro-batch, sequence and checkpointing. A step leaves the rig as it found
    it (the step zeroes its gradients with `set_to_none`; autocast empties its weight cache on exit;
    kept gradients are remade as zeros; each step runs a fresh precision policy, whose loss scaler
    makes its scale in the step, as a fresh model's does), so each step's trace is the one a fresh model gives, byte
    for byte (tests/plan/traced/test_hf.py); the model's build, fake parameters and warm-up step, an
    tenth of a step's CPU (Qwen3-0.6B), are paid once a rig instead of once a step."""

    def __init__(self, desc: HFDescription, setting: StepSetting, *, depth: int):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.desc, self.key = desc, self.key_of(setting)
        self.keeps_grads = setting.grad_accum > 1
        self.model = build_at_depth(desc, depth, self._policy())
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)  # bitsandbytes' lookup tables stay real constants
        self.tracker = MomentTracker()
        """the tracker of the step being traced (the hooks file into it)"""
        self.checkpointing = False
        with self.fake:
            materialize_fake(self.model)
            _fake_buffers(self.model)
        self.optimizer = build_optimizer(setting.optimizer, self.model)  # no tensors made: safe outside fake mode
        with self.fake:
            _warm_up(self.model, self.optimizer, keep_grads=self.keeps_grads)
        file_new_gradients(self.model, lambda: self.tracker)
        install_moments(self.model, self)
        _checkpointable(list(self.model.blocks or []), self)

    @staticmethod
    def key_of(setting: StepSetting) -> tuple:
        """What a rig fixes of the steps traced on it."""
        return (traced_precision(setting.precision), setting.optimizer, setting.grad_accum > 1)

    def step(self, setting: StepSetting) -> MomentTracker:
        """One steady-state training step of `setting` (of this rig's `key_of`), traced."""
        assert self.key_of(setting) == self.key, (
            "a rig traces the steps of one precision, optimizer and gradient keeping"
        )
        tracker = self.tracker = MomentTracker()
        self.checkpointing = setting.checkpointing == "full"
        policy = self._policy()  # a fresh one a step: a loss scaler makes its scale at the step's first scale()
        with self.fake:
            if self.keeps_grads:  # as the warm-up leaves them: the previous step set them to None
                for p in self.model.parameters():
                    if p.requires_grad and p.grad is None:
                        p.grad = torch.zeros_like(p)
            tag_state(tracker, self.model, self.optimizer)
            batch = fake_batch(self.desc.vocab_size, setting, tracker)
            with policy.run_context(), as_on_real_tensors(), tracker:
                tracker.label = "forward: embedding"
                _train_step(self.model, policy, self.optimizer, tracker, batch, loss_fn=forward_loss, count_fn=lm_count)
        return tracker

    def _policy(self) -> Precision:
        return build_precision(self.key[0], device_type="cpu")


def trace_hf_step(desc: HFDescription, setting: StepSetting, *, depth: int) -> MomentTracker:
    """One steady-state training step of `desc`'s model with `depth` decoder layers, on fake tensors
    (a rig of its own: `StepTraces` keeps rigs for the steps of a plan)."""
    return StepRig(desc, setting, depth=depth).step(setting)
