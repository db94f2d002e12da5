"""The OCP microscaling formats: MXFP8 through torchao's MX training matmul, MXFP4 by emulation.

MXFP8: torchao 0.18's MXFP8 training (`MXFP8TrainingOpConfig` through `quantize_`) dispatches each
Linear's matmul to one autograd Function, `torchao.prototype.moe_training.mxfp8_linear.mx_mm`: input,
weight and output gradient quantized to e4m3 in blocks of 32 under E8M0 (power-of-two, RCEIL-rounded)
scales, along each GEMM's contraction dimension, then multiplied (CUTLASS/Triton kernels on sm100;
`KernelPreference.EMULATED`: torchao's own dequantize-then-matmul in PyTorch, which runs on any
device). ampkit calls that Function from a Linear of its own (`MXFP8Linear`) rather than through
`quantize_`, whose weight-wrapper tensor subclass would land in the checkpoint's state dict (which
`torch.load(weights_only=True)` refuses); the GEMMs are the same. The wrapper casts input and weight to
the compute dtype (the Function takes both in one dtype: bf16 under autocast, as torchao's recipe
does) and pads the token count to whole blocks (the weight-gradient GEMM's blocks run along it).

MXFP4: torchao 0.18 has MXFP4 for inference only (`MXDynamicActivationMXWeightConfig`), no training
recipe, so `mxfp4` has no native path on any device and `mxfp4-emulated` rounds each GEMM's inputs to
e2m1 in blocks of 32 (`convert/qdq.py`): its fidelity, not its speed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.precision.convert.base import LinearConverter, adopt_linear, compute_dtype, replace_module
from ampkit.precision.convert.loading import load_torchao
from ampkit.precision.convert.qdq import QDQLinear

MX_BLOCK = 32  # elements per E8M0 scale (the OCP Microscaling spec)


class MXFP8Linear(nn.Linear):
    """An nn.Linear whose three GEMMs run in MXFP8 (torchao's `mx_mm`); `kernels`: "auto" (sm100) or
    "emulated" (any device)."""

    kernels: str = "auto"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(x)
        rows = x.reshape(-1, self.in_features).to(dtype)
        tokens = rows.shape[0]
        pad = (-tokens) % MX_BLOCK  # zero rows: no block's scale changes, their outputs are cut off below
        if pad:
            rows = F.pad(rows, (0, 0, 0, pad))
        out = _mx_matmul(rows, self.weight.to(dtype), emulated=self.kernels == "emulated")
        out = (out[:tokens] if pad else out).reshape(*x.shape[:-1], self.out_features)
        return out + self.bias.to(out.dtype) if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, format=mxfp8 ({self.kernels})"


def _mx_matmul(rows: torch.Tensor, weight: torch.Tensor, *, emulated: bool) -> torch.Tensor:
    """torchao's MXFP8 training matmul of (M, K) rows by an (N, K) weight (M, K, N multiples of 32)."""
    linear = load_torchao("prototype.moe_training.mxfp8_linear", what="mxfp8")
    config = load_torchao("prototype.mx_formats.config", what="mxfp8")
    kernels = load_torchao("quantization.quantize_.common", what="mxfp8").KernelPreference
    preference = kernels.EMULATED if emulated else kernels.AUTO
    # the function `MXFP8TrainingOpConfig`'s weight wrapper and torchao's MXFP8Linear both call
    return linear._to_mxfp8_then_scaled_mm(rows, weight, preference, config.ScaleCalculationMode.RCEIL)


class MXFP8Converter(LinearConverter):
    format_name = "mxfp8"

    def swap(self, model: nn.Module, names: list[str]) -> None:
        kernels = "emulated" if self.emulated else "auto"
        for fqn in names:
            replace_module(model, fqn, adopt_linear(MXFP8Linear, model.get_submodule(fqn), kernels=kernels))


class MXFP4Converter(LinearConverter):
    format_name = "mxfp4"
    native_missing = (
        "torchao 0.18 ships MXFP4 for inference only (MXDynamicActivationMXWeightConfig), no training recipe, so "
        "no kernel runs MXFP4 training on any GPU yet"
    )

    def guards_outputs(self) -> bool:
        return False  # the emulation returns a tensor of its own

    def swap(self, model: nn.Module, names: list[str]) -> None:
        for fqn in names:
            replace_module(model, fqn, adopt_linear(QDQLinear, model.get_submodule(fqn), format_name="mxfp4"))
