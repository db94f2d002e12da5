"""The what-if ledger's rounding: torchao's MX and NVFP4 quantize-dequantize reproduced bit for bit, the
casts' saturation and flush, the padding of a ragged last dimension, and each format's element range."""

from __future__ import annotations

import math

import pytest
import torch

from ampkit.diagnostics.whatif_qdq import (
    E2M1_GRID,
    WHAT_IF_FORMATS,
    element_range_binades,
    quantize_dequantize,
    round_e2m1,
)
from ampkit.errors import UsageError


def _wide(rows: int = 64, cols: int = 256) -> torch.Tensor:
    """Normal values spread over ~13 binades, zeros and exact ties of e2m1 inside some blocks."""
    torch.manual_seed(0)
    x = torch.randn(rows, cols) * torch.logspace(-2, 2, cols)
    x[0, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2)  # ties once scaled by 1
    x[1, :32] = 0.0  # an all-zero block
    return x


def _torchao_mx(x: torch.Tensor, elem: torch.dtype, rceil: bool) -> torch.Tensor:
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    mode = ScaleCalculationMode.RCEIL if rceil else ScaleCalculationMode.FLOOR
    return MXTensor.to_mx(x, elem, 32, scaling_mode=mode).dequantize(torch.float32)


def _torchao_nvfp4(x: torch.Tensor) -> torch.Tensor:
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    scale = per_tensor_amax_to_scale(x.abs().max())
    return NVFP4Tensor.to_nvfp4(x, block_size=16, per_tensor_scale=scale).dequantize(torch.float32)


@pytest.mark.parametrize(
    ("fmt", "reference"),
    [
        ("mxfp8", lambda x: _torchao_mx(x, torch.float8_e4m3fn, rceil=True)),
        ("mxfp4", lambda x: _torchao_mx(x, torch.float4_e2m1fn_x2, rceil=False)),
        ("nvfp4", _torchao_nvfp4),
    ],
)
def test_block_formats_round_exactly_as_torchao_does(fmt, reference):
    x = _wide()
    ours = quantize_dequantize(x, fmt)
    assert torch.equal(ours.values, reference(x))
    assert ours.block == (16 if fmt == "nvfp4" else 32)


def test_saturated_elements_are_clamped_at_their_blocks_largest_value():
    x = _wide()
    for fmt in ("mxfp4", "nvfp4"):  # FLOOR scales and rounded e4m3 scales clamp a block's largest values
        r = quantize_dequantize(x, fmt)
        assert r.saturated.any()
        assert (r.values[r.saturated].abs() < x[r.saturated].abs()).all()  # pulled in, never pushed out
        block = 16 if fmt == "nvfp4" else 32
        block_max = r.values.abs().reshape(-1, block).amax(dim=-1, keepdim=True).expand(-1, block).reshape(x.shape)
        assert torch.equal(r.values[r.saturated].abs(), block_max[r.saturated])  # clamped at 6 x the block's scale
    assert not quantize_dequantize(x, "mxfp8").saturated.any()  # RCEIL: the amax fits by construction


def test_e2m1_rounds_to_nearest_with_ties_to_even():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 6.0, 0.3, 2.9])
    assert round_e2m1(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, 6.0, 0.5, 3.0]
    assert set(round_e2m1(torch.linspace(-6, 6, 1001)).abs().tolist()) <= set(E2M1_GRID.tolist())


def test_fp16_saturates_and_flushes_bf16_keeps_both():
    x = torch.tensor([[7.0e4, -1.0e5, 1.0, 1e-8, 3e-8, 0.0]])
    fp16, bf16 = quantize_dequantize(x, "fp16"), quantize_dequantize(x, "bf16")
    assert fp16.saturated.tolist() == [[True, True, False, False, False, False]]
    assert fp16.values[0, :2].tolist() == [65504.0, -65504.0]  # clamped, so the error stays finite
    assert fp16.values[0, 3] == 0 and fp16.values[0, 4] != 0  # below half of 2^-24 flushes
    assert not bf16.saturated.any() and (bf16.values[0, :5] != 0).all()


def test_fp8_tensorwise_maps_the_amax_to_the_formats_max():
    x = _wide()
    for fmt, dtype in (("fp8-e4m3", torch.float8_e4m3fn), ("fp8-e5m2", torch.float8_e5m2)):
        r = quantize_dequantize(x, fmt)
        assert not r.saturated.any() and float(r.values.abs().max()) == pytest.approx(float(x.abs().max()), rel=1e-6)
        scale = torch.finfo(dtype).max / x.abs().max()
        assert torch.equal(r.values, (x * scale).to(dtype).float() / scale)


def test_a_ragged_last_dimension_is_padded_with_zeros_and_cut_back():
    x = _wide(8, 256)[:, :40]  # 40 = one block of 32 and 8 left over (nvfp4: 2 blocks and 8)
    for fmt in ("mxfp8", "nvfp4"):
        r = quantize_dequantize(x.contiguous(), fmt)
        assert r.values.shape == x.shape
        padded = torch.cat([x, torch.zeros(8, 24)], dim=1)
        assert torch.equal(r.values, quantize_dequantize(padded, fmt).values[:, :40])


def test_each_formats_element_range_in_binades():
    ranges = {fmt: element_range_binades(fmt) for fmt in WHAT_IF_FORMATS}
    assert ranges["fp16"] == pytest.approx(math.log2(65504 / 2**-24))
    assert ranges["fp8-e4m3"] == pytest.approx(math.log2(448 / 2**-9))
    assert ranges["fp8-e5m2"] == pytest.approx(math.log2(57344 / 2**-16))
    assert ranges["mxfp4"] == ranges["nvfp4"] == pytest.approx(math.log2(6 / 0.5))
    assert ranges["bf16"] > 250


def test_a_format_without_a_rounding_is_refused():
    with pytest.raises(UsageError, match="no what-if rounding for nf4"):
        quantize_dequantize(torch.ones(2, 2), "nf4")
