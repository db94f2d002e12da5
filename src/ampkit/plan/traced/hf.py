"""One training step of a transformers causal LM on fake tensors, at any depth: the traced ledger's raw data.

The engine is `plan/traced/trace.py`'s (chosen over `plan/task_plan.py`'s, which builds a task's model for
real inside `FakeTensorMode`): the model is built on the meta device (no initialisation work at
any size; transformers' init and `build_hf_model`'s causality check need real values), under the
precision policy's `init_context` (bf16-true weights are born bf16) and `convert_module` (fp8's
Float8Linear swap), wrapped in `HFCausalLM` (the module `ampkit train --model hf:PATH` trains),
its parameters and buffers replaced by fake CPU tensors, and then `ampkit.core.Trainer.train_step`
runs one steady-state step with the language model's loss (`forward_loss`), as `ampkit train`
does. Native fp8 is traced as fp8-emulated (torchao's emulation: the same recipe and memory).

`MomentTracker` files every storage under a ledger line like `StorageTracker` and also keeps, per
moment of the step (the label: "forward: block 3", "backward: block 0", "backward: loss", ...), the
lines at that moment's own peak: the extrapolation works on those (`plan/traced/extrapolate.py`). The
backward moments are marked by tensor hooks on the modules' outputs (never module backward hooks,
which wrap outputs in views that models such as Falcon then modify in place).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ampkit.core.step import forward_loss, lm_count
from ampkit.models.hf import HFCausalLM, HFModelInfo, decoder_layers
from ampkit.plan.describe.hf import HFDescription, meta_model
from ampkit.plan.describe.layers import check_copy, config_at_depth
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced.sharing import StepTrace, traced_precision
from ampkit.plan.traced.trace import (
    _train_step,
    checkpoint_task_blocks,
    convert_for_trace,
    fake_batch,
    materialize_fake,
    steady_state_optimizer,
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

    def _change(self, line: str, delta: int, what: str) -> None:
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


def _on_grad(tracker: MomentTracker, output: Any, label: str) -> None:
    tensor = _first_grad_tensor(output)
    if tensor is not None:
        tensor.register_hook(lambda grad: setattr(tracker, "label", label))


def install_moments(model: HFCausalLM, tracker: MomentTracker) -> None:
    """Label the step's moments: each decoder layer forward and backward, the head and the loss, the
    embedding's backward (tensor hooks on outputs mark where a module's backward begins)."""
    hf: Any = model.hf
    embed, head = hf.get_input_embeddings(), hf.get_output_embeddings()

    def forward_label(text: str):
        def hook(*_):
            in_backward = torch._C._current_graph_task_id() != -1  # a checkpointed block recomputed
            tracker.label = f"{text} recompute" if in_backward else text

        return hook

    def head_done(module, inputs, output):
        tracker.tag(output, "temporaries")  # logits: the loss region starts here
        tracker.phase, tracker.label = "temporaries", "forward: logits and loss"
        _on_grad(tracker, output, "backward: output head")

    embed.register_forward_pre_hook(forward_label("forward: embedding"))
    embed.register_forward_hook(lambda m, i, out: _on_grad(tracker, out, "backward: embedding"))
    for k, block in enumerate(model.blocks or []):
        block.register_forward_pre_hook(forward_label(f"forward: block {k}"))
        block.register_forward_hook(lambda m, i, out, k=k: _on_grad(tracker, out, f"backward: block {k}"))
    if head is not None:
        head.register_forward_pre_hook(forward_label("forward: final norm and head"))
        head.register_forward_hook(head_done)


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


def trace_hf_step(desc: HFDescription, setting: StepSetting, *, depth: int) -> MomentTracker:
    """One steady-state training step of `desc`'s model with `depth` decoder layers, on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    policy = build_precision(traced_precision(setting.precision), device_type="cpu")
    model = build_at_depth(desc, depth, policy)
    tracker = MomentTracker()
    fake = FakeTensorMode(allow_non_fake_inputs=True)  # bitsandbytes' lookup tables stay real constants
    with fake:
        materialize_fake(model)
        _fake_buffers(model)
    optimizer = steady_state_optimizer(model, setting, tracker, fake)
    with fake:
        install_moments(model, tracker)
        if setting.checkpointing == "full":
            checkpoint_task_blocks(list(model.blocks or []), tracker)
        batch = fake_batch(desc.vocab_size, setting, tracker)
        with policy.run_context(), as_on_real_tensors(), tracker:
            tracker.label = "forward: embedding"
            _train_step(model, policy, optimizer, tracker, batch, loss_fn=forward_loss, count_fn=lm_count)
    return tracker
