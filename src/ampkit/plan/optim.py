"""Optimizers the planner knows: their state bytes (analytic) and the real object (traced engine).

State per parameter tensor of n elements, with the parameter stored in `param_bytes` per element:
- `adamw`: torch AdamW (fused, as `ampkit train` builds it): exp_avg and exp_avg_sq in the
  parameter's dtype (2 x 4 B = 8 B/param with fp32 weights; 2 x 2 B under bf16-true, where torch
  keeps bf16 states) plus a 4-byte fp32 `step` per tensor.
- `adamw-8bit`: bitsandbytes AdamW8bit: for tensors of >= 4,096 elements two uint8 states (2 B/param)
  plus an fp32 absmax per 256-element block per state (~0.03 B/param) and two shared 256-entry fp32
  quantization maps; smaller tensors keep two fp32 states (8 B/param), as bitsandbytes does.
- `adamw-sr`: torchao's AdamW with bf16 stochastic rounding: adamw's states (in the weights' dtype).
- `adamw-kahan`: torch-optimi's AdamW with Kahan summation: adamw's two moments plus a compensation
  buffer, all in the weights' dtype (no per-tensor step tensor).
- `sgd`: torch SGD with momentum 0.9, as `ampkit train --optimizer sgd` builds it: one buffer in the
  parameter's dtype (`sgd-momentum`, this name's former spelling, is the same optimizer).
- `sgd-no-momentum`: torch SGD without momentum: no state.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ampkit.core.optim import SGD_MOMENTUM
from ampkit.core.optim import build_optimizer as core_build_optimizer
from ampkit.errors import UsageError
from ampkit.options import OPTIMIZERS as TRAIN_OPTIMIZERS

OPTIMIZERS = (*TRAIN_OPTIMIZERS, "sgd-no-momentum")
"""`ampkit train`'s optimizers (each name the same optimizer as there), and SGD without momentum."""
ALIASES = {"sgd-momentum": "sgd"}
"""Names plan took before its `sgd` became train's (momentum 0.9)."""
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes' min_8bit_size: smaller tensors keep 32-bit states
BNB_BLOCK = 256  # elements per absmax block of the blockwise 8-bit states (bitsandbytes >= 0.44)
BNB_QMAP_BYTES = 2 * 256 * 4  # two shared fp32 quantization maps


def check_optimizer(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {name!r}; choose from: {', '.join(OPTIMIZERS)}")
    return key


def optimizer_state_bytes(name: str, tensor_sizes: list[int], *, param_bytes: int) -> int:
    """Bytes of optimizer state for parameter tensors of `tensor_sizes` elements."""
    name = check_optimizer(name)
    n = sum(tensor_sizes)
    if name in ("adamw", "adamw-sr"):  # torchao's SR AdamW: the same states, in the weights' dtype
        return 2 * param_bytes * n + 4 * len(tensor_sizes)
    if name == "adamw-kahan":  # torch-optimi: two moments and a Kahan compensation, all in the weights' dtype
        return 3 * param_bytes * n
    if name == "sgd-no-momentum":
        return 0
    if name == "sgd":  # the momentum buffer
        return param_bytes * n
    total = BNB_QMAP_BYTES
    for size in tensor_sizes:
        if size >= BNB_MIN_8BIT_SIZE:
            total += 2 * size + 2 * 4 * math.ceil(size / BNB_BLOCK)
        else:
            total += 2 * 4 * size
    return total


def build_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """The real optimizer for the traced engine: `ampkit.core.build_optimizer`, the one `ampkit
    train` uses (the learning rate does not change what the step allocates): `sgd` with train's
    momentum 0.9, `sgd-no-momentum` without a momentum buffer."""
    name = check_optimizer(name)
    momentum = 0.0 if name == "sgd-no-momentum" else SGD_MOMENTUM
    core_name = "sgd" if name.startswith("sgd") else name
    return core_build_optimizer(model, name=core_name, lr=1e-3, weight_decay=0.1, momentum=momentum)
