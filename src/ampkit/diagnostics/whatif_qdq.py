"""A tensor rounded to a numeric format and back (quantize-dequantize), with what the rounding did to it.

For the what-if ledger (`whatif.py`): per format, the dequantized tensor in fp32 and, per element,
whether it saturated (its magnitude beyond the largest its scale can hold, so it was clamped), from
which the ledger counts the relative error, the share flushed to zero and the share saturated.
Blocks run along the last dimension (a Linear's in_features for its weight and input, out_features for
its output gradient: the forward's and dgrad's contraction axes); a last dimension that is no multiple
of the block is padded with zeros, which change no block's scale.

The formats, as ampkit's converters and torchao's training recipes scale them:
    bf16, fp16   a plain cast (no scale): fp16 saturates above 65504 (a real cast makes those inf; here
                 they are clamped to 65504 so the error stays finite, and counted as saturated) and
                 flushes below its smallest subnormal 2^-24 (gradients without a loss scale do)
    fp8-e4m3/e5m2  one dynamic scale per tensor mapping its amax to the format's max (torchao's tensorwise
                 recipe): nothing saturates; values more than the format's range below the amax flush
    mxfp8        e4m3 elements under an E8M0 (power-of-two) scale per 32, RCEIL scales: 2^ceil(log2(amax /
                 448)) (torchao's MXFP8 training default: a block's amax never exceeds 448 once scaled)
    mxfp4        e2m1 elements under an E8M0 scale per 32, FLOOR scales: 2^(floor(log2(amax)) - 2) (the OCP
                 spec's; a block's largest values may exceed 6 once scaled, and clamp)
    nvfp4        e2m1 under an e4m3 scale per 16 (amax / 6, over the tensor's scale, rounded to e4m3) and an
                 fp32 scale per tensor (amax / (448 x 6)); rounding to nearest, 1x16 blocks everywhere (NVIDIA's
                 recipe adds 16x16 weight blocks, Hadamard transforms and stochastic rounding, not modelled)
e2m1 rounds to the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (ties to the even code), saturating at 6.

The MX and NVFP4 rounding is torchao's own (`MXTensor.to_mx(...).dequantize()` and `NVFP4Tensor.to_nvfp4(...,
per_tensor_scale=...).dequantize()`, its scale rules step by step), written here as one vectorized pass:
torchao's CPU path packs and unpacks the 4-bit codes, several times slower over a model's weights.
tests/diagnostics/test_whatif_qdq.py checks that both agree with torchao bit for bit.
Units: elements; ranges in binades (log2 of a ratio of magnitudes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ampkit.errors import UsageError
from ampkit.formats import dtype_of, get_format

WHAT_IF_FORMATS = ("fp8-e4m3", "fp8-e5m2", "mxfp8", "mxfp4", "nvfp4", "bf16", "fp16")
"""The formats the ledger compares by default, in its column order."""
E2M1_MAX, E2M1_MIN_SUBNORMAL = 6.0, 0.5  # OCP MX spec: fp4 e2m1 holds 0, 0.5, 1, 1.5, 2, 3, 4, 6
E4M3 = dtype_of("fp8-e4m3")
E4M3_MAX = torch.finfo(E4M3).max


@dataclass(frozen=True)
class Rounded:
    """A tensor's quantize-dequantize (fp32, its shape) and the elements that saturated."""

    values: torch.Tensor
    saturated: torch.Tensor
    """bool, its shape: |x| beyond the largest value its (block's) scale represents"""
    block: int
    """elements sharing a scale along the last dimension (1: per tensor or none)"""


def element_range_binades(name: str) -> float:
    """log2(largest / smallest subnormal) of one element of format `name` (block formats: within a block)."""
    fmt = get_format(name)
    if fmt.dtype is None:  # packed 4-bit e2m1 (mxfp4, nvfp4): no torch finfo
        return math.log2(E2M1_MAX / E2M1_MIN_SUBNORMAL)
    info = torch.finfo(fmt.dtype)
    return math.log2(info.max / (info.smallest_normal * info.eps))  # subnormals reach smallest_normal x eps


def quantize_dequantize(tensor: torch.Tensor, name: str) -> Rounded:
    """`tensor` (any shape, blocks along its last dimension) rounded to format `name` and back."""
    fmt = get_format(name)
    if fmt.name not in _ROUNDERS:
        raise UsageError(f"no what-if rounding for {fmt.name}; choose from {', '.join(WHAT_IF_FORMATS)}")
    rows = tensor.detach().float().reshape(-1, tensor.shape[-1]) if tensor.dim() else tensor.float().reshape(1, 1)
    cols, block = rows.shape[-1], fmt.block
    pad = (-cols) % block
    padded = F.pad(rows, (0, pad)).contiguous() if pad else rows.contiguous()
    values, saturated = _ROUNDERS[fmt.name](padded)
    if pad:
        values, saturated = values[..., :cols], saturated[..., :cols]
    return Rounded(values=values.reshape(tensor.shape), saturated=saturated.reshape(tensor.shape), block=block)


def _cast(dtype: torch.dtype) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    fmax = torch.finfo(dtype).max

    def rounder(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        saturated = x.abs() > fmax
        return x.clamp(-fmax, fmax).to(dtype).float(), saturated

    return rounder


def _tensorwise(dtype: torch.dtype) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    fmax = torch.finfo(dtype).max

    def rounder(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = fmax / x.abs().max().clamp(min=1e-30)  # amax -> the format's max: nothing beyond it
        values = (x * scale).clamp(-fmax, fmax).to(dtype).float() / scale
        return values, torch.zeros_like(x, dtype=torch.bool)

    return rounder


E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E8M0_BIAS = 127
E4M3_TINY = torch.finfo(E4M3).tiny


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """`x` (already scaled, |x| <= 6) to the nearest e2m1 value, ties to even: e2m1's steps are 0.5 below
    2, 1 from 2 to 4 and 2 from 4 to 6, and `torch.round` rounds half to even, which on each step's grid
    is e2m1's even code (0.75 -> 1.0, 1.25 -> 1.0, 2.5 -> 2.0, 5.0 -> 4.0)."""
    magnitude = x.abs()
    step = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    return torch.copysign(torch.round(magnitude / step) * step, x)


def _mx(elem_max: float, *, fp4: bool, rceil: bool) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """OCP MX: blocks of 32, one power-of-two scale each (torchao's `to_mx`, FLOOR or RCEIL)."""
    emax = 2 if fp4 else 8  # the largest power of two of an e2m1 (4) or e4m3 (256) element

    def rounder(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = x.reshape(-1, 32)
        amax = blocks.abs().amax(dim=-1, keepdim=True)
        if rceil:
            exponent = torch.clamp(torch.ceil(torch.log2(amax / elem_max)), -E8M0_BIAS, E8M0_BIAS)
            divide_by = torch.where(exponent == -E8M0_BIAS, 1.0, torch.exp2(exponent))  # torchao's rcp of 2^-127: 1
        else:  # floor(log2(amax)) from the float's exponent bits, as torchao reads it
            floor_log2 = ((amax.view(torch.int32) >> 23) & 0xFF) - E8M0_BIAS
            exponent = torch.clamp(floor_log2 - emax, -E8M0_BIAS, E8M0_BIAS + 1).float()
            divide_by = torch.exp2(exponent).clamp(min=torch.finfo(torch.float32).tiny)
        unclamped = blocks / divide_by
        scaled = unclamped.clamp(-elem_max, elem_max)
        elements = round_e2m1(scaled) if fp4 else scaled.to(E4M3).float()
        values = (elements * torch.exp2(exponent)).reshape(x.shape)  # the scale the MMA multiplies by
        return values, (unclamped.abs() > elem_max).reshape(x.shape)

    return rounder


def _nvfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4: e2m1 under an e4m3 scale per 16 and an fp32 scale per tensor (torchao's `to_nvfp4`)."""
    amax = x.abs().max()
    if amax == 0:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    per_tensor = amax / (E4M3_MAX * E2M1_MAX)
    blocks = x.reshape(-1, 16)
    block_scale = blocks.abs().amax(dim=-1, keepdim=True) / E2M1_MAX
    e4m3 = torch.clamp(block_scale / per_tensor, min=E4M3_TINY, max=E4M3_MAX).to(E4M3).float()
    unclamped = blocks * ((1.0 / per_tensor) / e4m3)
    values = (round_e2m1(unclamped.clamp(-E2M1_MAX, E2M1_MAX)) * (per_tensor * e4m3)).reshape(x.shape)
    return values, (unclamped.abs() > E2M1_MAX).reshape(x.shape)


_ROUNDERS: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    "bf16": _cast(dtype_of("bf16")),
    "fp16": _cast(dtype_of("fp16")),
    "fp8-e4m3": _tensorwise(dtype_of("fp8-e4m3")),
    "fp8-e5m2": _tensorwise(dtype_of("fp8-e5m2")),
    "mxfp8": _mx(E4M3_MAX, fp4=False, rceil=True),
    "mxfp4": _mx(E2M1_MAX, fp4=True, rceil=False),
    "nvfp4": _nvfp4,
}
