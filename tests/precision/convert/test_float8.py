"""ampkit.precision.convert.float8: torchao's Float8Linear for the eligible Linears, the roofline's verdict
among the reasons a Linear stays in bf16, and outputs guarded for in-place consumers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.hardware.gpus import GPUS
from ampkit.precision import Fp8Options
from ampkit.precision.convert.float8 import Float8Converter
from ampkit.precision.fp8 import converted_layers
from ampkit.precision.fp8_roofline import Roofline

pytest.importorskip("torchao")


def test_the_roofline_keeps_the_layers_it_predicts_no_gain_for():
    model = nn.ModuleDict({"small": nn.Linear(64, 64), "big": nn.Linear(8192, 8192)})
    options = Fp8Options(tokens=16384, roofline=Roofline.from_gpu(GPUS["H100-80GB"]))
    report = Float8Converter(precision="fp8-emulated", emulated=True, options=options).convert(model)
    assert report.converted == ["big"] and converted_layers(model) == ["big"]
    assert report.kept == {"small": "predicted not to gain on this GPU (fp8 roofline)"}


def test_a_converted_output_takes_an_in_place_add():
    model = nn.Sequential(nn.Linear(32, 32))
    Float8Converter(precision="fp8-emulated", emulated=True).convert(model)
    x = torch.randn(2, 4, 32, requires_grad=True)
    out = model(x)
    out += 1.0  # Falcon's `mlp_output += attention_output`: a view made inside torchao's Function would raise
    out.sum().backward()
    assert not out._is_view() and x.grad is not None
