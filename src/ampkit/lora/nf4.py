"""QLoRA's base: the targeted Linear layers stored 4-bit NormalFloat (nf4, bitsandbytes' `Linear4bit`,
double-quantised block statistics as the QLoRA paper), dequantised on the fly to the precision's
compute dtype for each matmul.

bitsandbytes runs 4-bit layers on CUDA and, since its multi-backend releases, on CPU (and some other
devices). Whether it runs on *this* device is asked of the library itself: `check_nf4_supported`
quantises a 64 x 64 layer there and runs a forward and backward through it, once per (device, dtype).
A device where that fails is refused before any model is built, with the library's reason and the
alternative (a 16-bit base).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError

_PROBE_FEATURES = 64


def load_bitsandbytes_4bit():
    """bitsandbytes, imported quietly; its absence names the extra to install."""
    logger = logging.getLogger("bitsandbytes")
    level = logger.level
    logger.setLevel(logging.ERROR)  # a notice about an optional CPU kernel package at import
    try:
        import bitsandbytes
    except ImportError:
        raise UsageError(
            "--base-dtype nf4 needs bitsandbytes; install it with pip install 'ampkit[lora,8bit]' "
            "(or use --base-dtype bf16)"
        ) from None
    finally:
        logger.setLevel(level)
    return bitsandbytes


def _probe(device: torch.device, compute_dtype: torch.dtype) -> None:
    """Quantise a small layer on `device` and run forward + backward; raises what the library raises."""
    bnb = load_bitsandbytes_4bit()
    layer = _quantized(nn.Linear(_PROBE_FEATURES, _PROBE_FEATURES, bias=False), device, compute_dtype, bnb)
    x = torch.randn(2, _PROBE_FEATURES, device=device, dtype=compute_dtype, requires_grad=True)
    layer.eval()
    with torch.no_grad():
        layer(x.detach())  # an evaluation first, as a run's step 0 does (it must not change the training path)
    layer.train()
    layer(x).float().sum().backward()
    if x.grad is None or not bool(torch.isfinite(x.grad).all()):
        raise RuntimeError("the 4-bit layer's backward gave no finite gradient")


@functools.cache
def _probe_result(device: str, dtype: str) -> str | None:
    try:
        _probe(torch.device(device), getattr(torch, dtype))
    except UsageError:
        raise
    except Exception as err:  # whatever the library raises for an unsupported device or dtype
        text = str(err).strip().splitlines()
        return f"{type(err).__name__}: {text[0][:160]}" if text else type(err).__name__
    return None


def check_nf4_supported(device: torch.device, compute_dtype: torch.dtype) -> None:
    """Refuse `--base-dtype nf4` where bitsandbytes' 4-bit layers do not run (UsageError with the fix)."""
    dtype = str(compute_dtype).removeprefix("torch.")
    reason = _probe_result(str(device), dtype)
    if reason is not None:
        raise UsageError(
            f"--base-dtype nf4: bitsandbytes' 4-bit layers do not run on {device} with {dtype} compute ({reason}); "
            "use --base-dtype bf16 (LoRA on a 16-bit base, about 4x the memory of an nf4 base) or run on a CUDA GPU"
        )


def _quantized(linear: nn.Linear, device: torch.device, compute_dtype: torch.dtype, bnb) -> nn.Module:
    layer = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        compute_dtype=compute_dtype,
        quant_type="nf4",
        compress_statistics=True,
        device="meta",
    )
    weight = linear.weight.detach().to(compute_dtype)
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4", compress_statistics=True)
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().to(compute_dtype), requires_grad=False)
    # On AVX512-BF16 CPUs bitsandbytes repacks the weight in place for inference the first time the layer
    # runs in eval mode, and from then on uses a kernel with no backward, in training too: gradients would
    # stop flowing through the base to earlier adapters. Keep the one layout that trains.
    if hasattr(layer, "support_avx512bf16_for_cpu"):
        layer.support_avx512bf16_for_cpu = False
    return layer.to(device)  # quantises the weight (on the device's kernels)


def quantize_linears(model: nn.Module, paths: list[str], *, compute_dtype: torch.dtype) -> int:
    """Replace the nn.Linear at each of `paths` by a 4-bit layer on the same device; returns how many.
    A target that is not an nn.Linear (an Embedding, transformers' Conv1D) is refused."""
    bnb = load_bitsandbytes_4bit()
    modules = dict(model.named_modules())
    for path in paths:
        linear = modules[path]
        if type(linear) is not nn.Linear:
            raise UsageError(
                f"--base-dtype nf4 quantises nn.Linear layers, and target {path} is a {type(linear).__name__}; "
                "use --base-dtype bf16, or --lora-targets naming Linear layers only"
            )
        parent_path, _, name = path.rpartition(".")
        parent = modules[parent_path] if parent_path else model
        setattr(parent, name, _quantized(linear, linear.weight.device, compute_dtype, bnb))
    return len(paths)


def dequantize(layer: Any) -> torch.Tensor:
    """A 4-bit layer's weight, dequantised to its compute dtype (the merged export)."""
    bnb = load_bitsandbytes_4bit()
    weight: Any = layer.weight  # bitsandbytes' Params4bit
    return bnb.functional.dequantize_4bit(weight.data, weight.quant_state).to(layer.compute_dtype)


def is_4bit(module: nn.Module) -> bool:
    return type(module).__name__ == "Linear4bit"
