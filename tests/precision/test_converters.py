"""The low-bit formats' converters (`ampkit.precision.convert`): one per format, named by the registry; their
shape rules and the Linears they keep; the emulation's three GEMMs against a direct quantize-dequantize of
the same tensors; torchao's MXFP8 matmul against the same rounding; refusals in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.formats import FORMATS
from ampkit.precision import SPECS, ConversionRefused, build_precision
from ampkit.precision.convert import CONVERTERS, converter_class, quantize_dequantize
from ampkit.precision.convert.mx import MXFP8Linear
from ampkit.precision.convert.qdq import QDQLinear

pytest.importorskip("torchao")

EMULATED = sorted(name for name, spec in SPECS.items() if spec.converts_linears and spec.emulated)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def test_every_low_bit_format_names_its_own_converter_class():
    named = {fmt.converter: name for name, fmt in FORMATS.items() if fmt.converter}
    assert set(named) == set(CONVERTERS)  # one class per format, each named once by the registry
    for fmt_name in named.values():
        assert converter_class(FORMATS[fmt_name]).format_name == fmt_name
        assert FORMATS[fmt_name].native is not None and FORMATS[fmt_name].dim_multiple > 1
    for spec in SPECS.values():  # every precision that converts Linears reaches a converter through its format
        assert spec.converts_linears is bool(spec.linear_format.converter)


class _Net(nn.Module):
    """Linears of three shapes: 64x96 (every format), 48x64 (16-multiples: fp8, nvfp4), 40x64 (none), a head."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.mid = nn.Linear(48, 64, bias=False)
        self.odd = nn.Linear(40, 64)
        self.lm_head = nn.Linear(64, 64)


@pytest.mark.parametrize(
    ("precision", "converted"),
    [("fp8-emulated", ["up", "mid"]), ("nvfp4-emulated", ["up", "mid"]), ("mxfp8-emulated", ["up"])],
)
def test_the_shape_rule_keeps_layers_in_bf16_and_says_why(precision, converted):
    policy = build_precision(precision, device_type="cpu")
    model = policy.convert_module(_Net())
    report = policy.conversion()
    assert report is not None and report.converted == converted
    assert report.kept["lm_head"] == "the output head"
    assert report.kept["odd"].startswith("40x64 not multiples of ")
    assert ("mid" in report.kept) is (precision == "mxfp8-emulated")  # 48 holds no whole block of 32
    assert all(type(getattr(model, name)) is not nn.Linear for name in converted)
    assert report.to_dict()["kept"] == report.kept and precision in report.note()


def test_a_model_with_no_linear_the_shape_rule_admits_is_refused_in_one_line():
    model = nn.Sequential(nn.Linear(40, 24), nn.ReLU(), nn.Linear(24, 8))
    with pytest.raises(
        ConversionRefused, match=r"^mxfp8-emulated has nothing to convert in this model: none of its 2"
    ) as no:
        build_precision("mxfp8-emulated", device_type="cpu").convert_module(model)
    assert "0: 40x24 not multiples of 32" in str(no.value) and "use bf16-mixed" in str(no.value)
    assert "\n" not in str(no.value) and isinstance(no.value, UsageError)  # exit code 2 in every command
    assert all(type(m) in (nn.Linear, nn.ReLU, nn.Sequential) for m in model.modules())  # untouched


def test_unknown_formats_and_precisions_are_one_line_refusals():
    with pytest.raises(UsageError, match=r"unknown precision 'nvfp5-emulated'; choose one of: .*nvfp4-emulated"):
        build_precision("nvfp5-emulated", device_type="cpu")
    with pytest.raises(UsageError, match="no quantize-dequantize for bf16"):
        quantize_dequantize(torch.ones(4, 32), "bf16")


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


@pytest.mark.parametrize("precision", EMULATED)
def test_emulated_formats_train_on_the_meta_device_built_model_and_keep_fp32_weights(precision):
    from ampkit.models import build_model, get_preset

    policy = build_precision(precision, device_type="cpu")
    model = policy.convert_module(build_model(get_preset("tiny", n_layers=1), seed=0))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    ids = torch.randint(0, 256, (2, 16))
    with policy.forward_context():
        loss = model(ids).float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
