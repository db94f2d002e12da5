"""ampkit.precision.convert.base: one converter per format, named by the registry; the shape rule, the
Linears each keeps in bf16 and why, and the one-line refusal of a model with nothing to convert."""

from __future__ import annotations

import pytest
from torch import nn

from ampkit.errors import UsageError
from ampkit.formats import FORMATS
from ampkit.precision import SPECS, ConversionRefused, build_precision
from ampkit.precision.convert import CONVERTERS, converter_class
from ampkit.precision.convert.base import HEAD, LinearConverter
from ampkit.precision.convert.report import ConversionReport

pytest.importorskip("torchao")


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


def test_an_unknown_precision_is_a_one_line_refusal():
    with pytest.raises(UsageError, match=r"unknown precision 'nvfp5-emulated'; choose one of: .*nvfp4-emulated"):
        build_precision("nvfp5-emulated", device_type="cpu")


def test_attention_out_proj_the_root_and_converted_layers_are_left_alone():
    attention = nn.MultiheadAttention(32, 2)  # multiplies out_proj.weight itself, never calls its forward
    model = nn.ModuleDict({"attn": attention, "ff": nn.Linear(32, 32)})
    report = build_precision("nvfp4-emulated", device_type="cpu").converter().classify(model)
    assert report.converted == ["ff"] and report.kept == {
        "attn.out_proj": "read by nn.MultiheadAttention through its weight"
    }
    policy = build_precision("nvfp4-emulated", device_type="cpu")
    policy.convert_module(model)
    with pytest.raises(ConversionRefused, match=r"\(inner.attn.out_proj: read by nn.MultiheadAttention"):
        policy.converter().classify(nn.ModuleDict({"inner": model}))  # "ff" converted already: nothing is left
    root = policy.converter().classify(nn.Sequential(nn.Linear(32, 32)))
    assert root.converted == ["0"]
    with pytest.raises(ConversionRefused, match="nothing to convert"):
        policy.converter().classify(nn.Linear(32, 32))  # a bare Linear is the model itself


def test_the_report_names_the_kept_layers_in_one_line():
    report = ConversionReport(
        precision="mxfp8-emulated", format="mxfp8", emulated=True, converted=["a", "b"],
        kept={"lm_head": HEAD, "c": "40x64 not multiples of 32", "d": "x", "e": "y"},
    )  # fmt: skip
    note = report.note()
    assert note.startswith("mxfp8-emulated: 2 of 6 Linears in mxfp8 (emulated: fidelity, not speed); kept in bf16: ")
    assert note.endswith("c (40x64 not multiples of 32), d (x) and 1 more") and "\n" not in note


def test_a_converter_without_a_swap_is_a_programming_error():
    class Nothing(LinearConverter):
        format_name = "mxfp8"

    with pytest.raises(NotImplementedError):
        Nothing(precision="mxfp8-emulated", emulated=True).convert(nn.Sequential(nn.Linear(32, 32)))
