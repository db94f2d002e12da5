"""Training FLOPs per item for any task: the task's analytic count where it has one (the language
model's 6N + attention), else measured with `torch.utils.flop_counter.FlopCounterMode` over one
forward and backward of a batch.

Units: FLOPs (floating-point operations, a multiply-add is 2), not FLOP/s. FlopCounterMode counts
the matmul-like ops (mm, bmm, addmm, convolution, scaled-dot-product attention) forward and
backward; elementwise ops, norms and the loss are not counted, as MFU conventions leave them out.
The measured count is per *slot* (padding included): MFU credits the hardware with the work it did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ampkit.core.counts import as_counts
from ampkit.core.step import StepPolicy, policy_loss
from ampkit.tasks import optional
from ampkit.tasks.base import Task


def _cpu_flash_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def flop_counter() -> FlopCounterMode:
    """FlopCounterMode, also counting the CPU flash-attention kernels SDPA takes on CPU (torch's table
    has the CUDA ones only): the full Q K^T and A V products, forward and backward."""
    aten = torch.ops.aten
    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_forward,  # the op packet, as the table keys
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward,
    }
    return FlopCounterMode(display=False, custom_mapping=mapping)


@dataclass(frozen=True)
class FlopsPerItem:
    value: float | None
    """training FLOPs per item (forward + backward), or None when nothing could be counted"""
    source: str
    """"analytic" (the task's own formula) or "measured" (FlopCounterMode on one batch)"""

    def to_dict(self) -> dict[str, Any]:
        return {"flops_per_item": self.value, "flops_source": self.source}


def measure_training_flops(task: Task, model: nn.Module, batch: Any, *, policy: StepPolicy) -> tuple[int, int]:
    """(FLOPs of one forward + backward of `batch` under the model's `policy`, slots in it). Leaves the
    weights and their gradients as they were (gradients cleared) and BatchNorm statistics unmoved (eval
    mode: the matmul and convolution FLOPs are the same in both modes)."""
    was_training = model.training
    model.eval()
    try:
        with flop_counter() as counter:
            loss, _ = policy_loss(policy, task.loss, model, batch)
            loss.backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    slots = as_counts(task.count(batch)).slots
    return int(counter.get_total_flops()), slots


def flops_per_item(task: Task, model: nn.Module, batch: Any, *, batch_size: int, policy: StepPolicy) -> FlopsPerItem:
    """The task's analytic count, else the measured one (a forward and backward of `batch`, converted
    by `policy` as the step converts it: a bench sweep measures under its candidate's precision)."""
    analytic = optional.flops_per_item(task, batch_size=batch_size)
    if analytic is not None:
        return FlopsPerItem(float(analytic), "analytic")
    with torch.enable_grad():
        flops, slots = measure_training_flops(task, model, batch, policy=policy)
    return FlopsPerItem(flops / slots if flops and slots else None, "measured")
