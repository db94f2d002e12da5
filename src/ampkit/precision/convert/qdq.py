"""Emulated block-scaled training: quantize-dequantize the inputs of a Linear's three GEMMs.

Where torchao ships no training recipe that runs off Blackwell (NVFP4, MXFP4), ampkit emulates one:
each GEMM's two inputs are quantized to the format along the GEMM's contraction dimension (the
dimension a hardware block runs along) and dequantized, and the GEMM then runs in fp32:
    forward   y  = q(x) @ q(W)^T           blocks along in_features (K)
    dgrad     dx = q(dy) @ q(W^T)^T        blocks along out_features (N)
    wgrad     dW = q(dy^T) @ q(x^T)^T      blocks along the tokens (M)
The elements are torchao's own quantizers (`MXTensor.to_mx`, `NVFP4Tensor.to_nvfp4`: the rounding,
saturation and scale rules of torchao's MX and NVFP4 kernels), so what is measured is the format's
rounding of the real tensors of the run: its fidelity, never its speed (every GEMM here runs at fp32's
speed plus the cost of rounding in software).

Why fp32 GEMMs: a dequantized MX element (e2m1 or e4m3 times a power of two) is exact in bf16 and fp32
alike, but an NVFP4 one (e2m1 x an e4m3 block scale x an fp32 tensor scale) is not exact in bf16;
Blackwell's MMA multiplies the exact values and accumulates in fp32, which fp32 reproduces. The output
is cast to the compute dtype (bf16 under autocast), as the hardware's output is.

What it does not emulate: NVIDIA's NVFP4 training recipe also uses 16x16 (2D) weight blocks, random
Hadamard transforms on the weight-gradient GEMM's inputs and stochastic rounding of gradients
(torchao's native `NVFP4TrainingConfig` does all three); the emulation rounds to nearest with 1x16
blocks everywhere, so its fidelity is that of the plain format, a bound the full recipe improves on.

A block that runs past the end of a dimension (a token count that is no multiple of the block) is
padded with zeros, which change no block's scale. Units: elements; block sizes from `ampkit.formats`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.errors import UsageError
from ampkit.formats import dtype_of, get_format
from ampkit.precision.convert.base import compute_dtype
from ampkit.precision.convert.loading import load_torchao

Quantizer = Callable[[torch.Tensor], torch.Tensor]
"""rows of a 2-D tensor -> their quantize-dequantize, in fp32, blocks along the last dimension"""


def _mx(elem: torch.dtype, *, rceil: bool) -> Quantizer:
    mx = load_torchao("prototype.mx_formats.mx_tensor", what="MX formats")
    config = load_torchao("prototype.mx_formats.config", what="MX formats")
    mode = config.ScaleCalculationMode.RCEIL if rceil else config.ScaleCalculationMode.FLOOR

    def qdq(rows: torch.Tensor) -> torch.Tensor:
        return mx.MXTensor.to_mx(rows, elem, 32, scaling_mode=mode).dequantize(torch.float32)

    return qdq


def _nvfp4() -> Quantizer:
    nv = load_torchao("prototype.mx_formats.nvfp4_tensor", what="NVFP4")

    def qdq(rows: torch.Tensor) -> torch.Tensor:
        # two-level scale: one fp32 per tensor (amax / (6 x 448), torchao's rule) under an e4m3 per 16
        scale = nv.per_tensor_amax_to_scale(rows.abs().max().float())
        return nv.NVFP4Tensor.to_nvfp4(rows, block_size=16, per_tensor_scale=scale).dequantize(torch.float32)

    return qdq


def _fp8_tensorwise(rows: torch.Tensor) -> torch.Tensor:
    """float8 e4m3 under one dynamic scale per tensor (torchao's tensorwise recipe: amax maps to 448)."""
    e4m3 = dtype_of("fp8-e4m3")
    fmax = torch.finfo(e4m3).max
    scale = fmax / rows.abs().max().float().clamp(min=1e-12)
    return (rows.float() * scale).clamp(-fmax, fmax).to(e4m3).float() / scale


def _quantizers() -> dict[str, Callable[[], Quantizer]]:
    return {
        "fp8-e4m3": lambda: _fp8_tensorwise,
        "mxfp8": lambda: _mx(dtype_of("mxfp8"), rceil=True),  # torchao's MXFP8 training: RCEIL scales
        # torchao names MXFP4's packed e2m1 pairs by torch's float4_e2m1fn_x2 (no element dtype: the registry
        # holds none); the OCP spec's floor(log2(amax)) scales
        "mxfp4": lambda: _mx(torch.float4_e2m1fn_x2, rceil=False),
        "nvfp4": _nvfp4,
    }


def quantizer(format_name: str) -> Quantizer:
    """The quantize-dequantize of `format_name`'s elements along the last dimension of a 2-D tensor
    (padded to whole blocks, then cut back), in fp32."""
    fmt = get_format(format_name)
    makers = _quantizers()
    if fmt.name not in makers:
        raise UsageError(f"no quantize-dequantize for {fmt.name}; one of: {', '.join(makers)}")
    inner, block = makers[fmt.name](), fmt.block

    def qdq(rows: torch.Tensor) -> torch.Tensor:
        cols = rows.shape[-1]
        pad = (-cols) % block
        padded = F.pad(rows, (0, pad)) if pad else rows
        out = inner(padded.contiguous())
        return out[..., :cols] if pad else out

    return qdq


def quantize_dequantize(tensor: torch.Tensor, format_name: str) -> torch.Tensor:
    """`tensor` rounded to `format_name` (blocks along its last dimension), back in fp32: the error a
    converted Linear's GEMM inputs carry (`(quantize_dequantize(x, f) - x).norm() / x.norm()`)."""
    rows = tensor.reshape(-1, tensor.shape[-1]) if tensor.dim() != 2 else tensor
    return quantizer(format_name)(rows).reshape(tensor.shape)


class _QDQMatmul(torch.autograd.Function):
    """(M, K) x (N, K) -> (M, N) with both inputs of each of the three GEMMs quantize-dequantized along
    its contraction dimension; GEMMs in fp32. Saves the input (in its dtype) and the weight (a reference):
    the memory of a Linear that saves its high-precision inputs, as torchao's Float8Linear does."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, q: Quantizer, out_dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.q = q
        return (q(x) @ q(weight).t()).to(out_dtype)  # (M, N): a new tensor, no view (safe in place)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        x, weight = ctx.saved_tensors
        q, g = ctx.q, grad_out.float()
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = (q(g) @ q(weight.t()).t()).to(x.dtype)  # (M, N) x (N, K): blocks along N
        if ctx.needs_input_grad[1]:
            grad_w = (q(g.t()) @ q(x.t()).t()).to(weight.dtype)  # (N, M) x (M, K): blocks along M
        return grad_x, grad_w, None, None


class QDQLinear(nn.Linear):
    """An nn.Linear whose three GEMMs see `format_name`'s rounding (`_QDQMatmul`); built by a converter
    (`adopt_linear`), it holds the original Linear's parameters."""

    format_name: str = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(x)  # what autocast would multiply in (bf16): the dtype the GEMM inputs arrive in
        rows = x.reshape(-1, self.in_features).to(dtype)
        out = _QDQMatmul.apply(rows, self.weight, _cached_quantizer(self.format_name), dtype)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out + self.bias.to(out.dtype) if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, format={self.format_name} (emulated)"


_QUANTIZERS: dict[str, Quantizer] = {}


def _cached_quantizer(format_name: str) -> Quantizer:
    """One quantizer per format per process (its torchao imports resolved once)."""
    if format_name not in _QUANTIZERS:
        _QUANTIZERS[format_name] = quantizer(format_name)
    return _QUANTIZERS[format_name]
