"""ampkit.precision.convert.qdq: the emulation's rounding is torchao's quantizers', along each GEMM's
contraction dimension; its three GEMMs equal the same GEMMs of directly rounded tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.formats import FORMATS
from ampkit.precision.convert.qdq import QDQLinear, quantize_dequantize

pytest.importorskip("torchao")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4", "mxfp4", "fp8-e4m3"])
def test_quantize_dequantize_rounds_to_the_format(fmt):
    x = torch.randn(8, 96, generator=torch.Generator().manual_seed(0))
    q = quantize_dequantize(x, fmt)
    assert q.dtype == torch.float32 and q.shape == x.shape
    assert torch.equal(quantize_dequantize(q, fmt), q)  # representable values stay put
    ragged = quantize_dequantize(x[:, :40], fmt)  # 40 columns: the last block padded with zeros
    block = FORMATS[fmt].block
    assert torch.equal(ragged[:, :block], q[:, :block]) and ragged.shape == (8, 40)


def test_the_formats_fidelity_falls_with_their_bits():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    err = {fmt: _rel(quantize_dequantize(x, fmt), x) for fmt in ("mxfp8", "nvfp4", "mxfp4")}
    # e4m3 keeps ~2^-4 relative steps; e2m1 ~2^-2, NVFP4's e4m3 scale per 16 finer than MXFP4's 2^k per 32
    assert err["mxfp8"] < 0.05 < err["nvfp4"] < err["mxfp4"] < 0.2, err


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_the_emulated_gemms_are_the_quantize_dequantize_of_their_inputs(fmt):
    """Forward, input-gradient and weight-gradient GEMMs equal the same GEMMs of directly rounded tensors
    (blocks along each GEMM's contraction dimension: in, out and token dimensions)."""
    g = torch.Generator().manual_seed(2)
    linear = nn.Linear(64, 32, bias=False)
    layer = QDQLinear(64, 32, bias=False)
    layer.weight, layer.format_name = linear.weight, fmt
    x = torch.randn(48, 64, generator=g, requires_grad=True)  # 48 tokens: the wgrad blocks padded
    dy = torch.randn(48, 32, generator=g)
    y = layer(x)
    y.backward(dy)
    w = linear.weight.detach()
    q = lambda t: quantize_dequantize(t.contiguous(), fmt)  # noqa: E731
    assert torch.equal(y, q(x.detach()) @ q(w).t())
    assert torch.equal(x.grad, q(dy) @ q(w.t()).t())
    assert torch.equal(linear.weight.grad, q(dy.t()) @ q(x.detach().t()).t())


def test_a_format_without_an_emulation_is_refused():
    with pytest.raises(UsageError, match="no quantize-dequantize for bf16; one of: fp8-e4m3, mxfp8, mxfp4, nvfp4"):
        quantize_dequantize(torch.ones(4, 32), "bf16")
