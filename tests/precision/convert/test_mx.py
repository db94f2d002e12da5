"""ampkit.precision.convert.mx: torchao's MXFP8 training matmul rounds as the direct quantize-dequantize;
MXFP4 has no native kernel anywhere (a refusal naming its emulation)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.precision import ConversionRefused, build_precision
from ampkit.precision.convert.mx import MXFP4Converter, MXFP8Linear
from ampkit.precision.convert.qdq import QDQLinear, quantize_dequantize

pytest.importorskip("torchao")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def test_torchaos_mxfp8_matmul_rounds_as_the_direct_quantize_dequantize():
    g = torch.Generator().manual_seed(3)
    layer = MXFP8Linear(64, 32, bias=False)
    layer.kernels = "emulated"
    x = torch.randn(40, 64, generator=g, requires_grad=True)  # 40 tokens: padded to 64 rows, cut back
    y = layer(x)
    expected = quantize_dequantize(x.detach(), "mxfp8") @ quantize_dequantize(layer.weight.detach(), "mxfp8").t()
    assert y.shape == (40, 32) and _rel(y, expected) < 1e-5  # the same rounding, fp32 matmuls both
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and layer.weight.grad is not None


def test_native_mxfp4_is_refused_and_its_emulation_converts():
    with pytest.raises(
        ConversionRefused, match=r"^mxfp4: torchao 0.18 ships MXFP4 for inference only.*; use mxfp4-emulated$"
    ):
        MXFP4Converter(precision="mxfp4", emulated=False).convert(nn.Sequential(nn.Linear(32, 32)))
    model = build_precision("mxfp4-emulated", device_type="cpu").convert_module(nn.Sequential(nn.Linear(32, 32)))
    assert isinstance(model[0], QDQLinear) and model[0].format_name == "mxfp4"
