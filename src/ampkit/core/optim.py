"""The one optimizer factory: train, bench, doctor, the smoke test and the planner's traced step
all build their optimizer here, so "AdamW" means the same betas, eps and weight-decay groups
everywhere.

- `adamw`: torch's fused AdamW (one pass over all parameters, CPU and CUDA).
- `adamw-8bit`: bitsandbytes' block-wise 8-bit AdamW (same betas/eps); it keeps tensors under
  4,096 elements in 32-bit states, as the library does by default. Loaded lazily.
- `adamw-sr`: torchao's AdamW with bf16 stochastic rounding: a bf16 weight's update is rounded up or
  down at random in proportion to the remainder, so small updates are kept on average instead of
  being lost to round-to-nearest (bf16-true's failure mode). States in the weights' dtype.
- `adamw-kahan`: torch-optimi's AdamW with Kahan summation: a bf16 compensation buffer per weight
  carries what rounding dropped into the next update (2 more bytes a parameter).
- `sgd`: SGD with `momentum` (0.9 unless the caller says otherwise).
Weight decay applies to matrices only (norm gains and other vectors are not decayed).
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.options import OPTIMIZERS

ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8
SGD_MOMENTUM = 0.9


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters in two groups: matrices decayed, vectors (norms, biases) not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module, *, name: str, lr: float, weight_decay: float, momentum: float = SGD_MOMENTUM
) -> torch.optim.Optimizer:
    """The optimizer `name` over `model`'s trainable parameters (see the module docstring)."""
    groups = param_groups(model, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, fused=True)
    if name == "adamw-8bit":
        return load_bitsandbytes().optim.AdamW8bit(groups, lr=lr, betas=ADAMW_BETAS, eps=ADAMW_EPS)
    if name == "adamw-sr":
        from torchao.optim import _AdamW  # torchao is a test dependency; the fp8 extra installs it

        return _AdamW(groups, lr=lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, bf16_stochastic_round=True)
    if name == "adamw-kahan":
        return load_optimi().AdamW(groups, lr=lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, kahan_sum=True)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum)
    raise UsageError(f"unknown --optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")


def check_optimizer_available(name: str) -> None:
    """Fail before anything is built when the optimizer's library is missing (names the extra)."""
    if name == "adamw-8bit":
        load_bitsandbytes()
    if name == "adamw-kahan":
        load_optimi()
    if name == "adamw-sr":
        try:
            import torchao.optim  # noqa: F401
        except ImportError:
            raise UsageError("--optimizer adamw-sr needs torchao: pip install 'ampkit[fp8]'") from None


def load_optimi() -> ModuleType:
    """torch-optimi, lazily; its absence names the extra."""
    try:
        import optimi
    except ImportError:
        raise UsageError("--optimizer adamw-kahan needs torch-optimi: pip install 'ampkit[optimi]'") from None
    return optimi


def load_bitsandbytes() -> ModuleType:
    """Import bitsandbytes lazily; its absence names the extra to install."""
    # bitsandbytes logs a warning at import on AVX512-BF16 CPUs about an optional 4-bit matmul
    # kernel package; 8-bit optimizer states do not use it, so keep it off the user's console.
    bnb_logger = logging.getLogger("bitsandbytes")
    level = bnb_logger.level
    bnb_logger.setLevel(logging.ERROR)
    try:
        import bitsandbytes
    except ImportError:
        raise UsageError(
            "--optimizer adamw-8bit needs bitsandbytes; install it with "
            "pip install 'ampkit[8bit]' (or use --optimizer adamw)"
        ) from None
    finally:
        bnb_logger.setLevel(level)
    return bitsandbytes
