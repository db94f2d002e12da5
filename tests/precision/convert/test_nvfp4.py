"""ampkit.precision.convert.nvfp4: native NVFP4 (torchao's Triton kernels) wants 128-multiples and keeps no
state a meta-device build would lose; the emulation converts 16-multiples. The native GEMMs need an sm100
GPU and are not run here."""

from __future__ import annotations

import pytest
from torch import nn

from ampkit.precision.convert.nvfp4 import RHT_SIGNS, NVFP4Converter, NVFP4Linear, _seed_of
from ampkit.precision.convert.qdq import QDQLinear

pytest.importorskip("torchao")


def _net() -> nn.Module:
    return nn.ModuleDict({"wide": nn.Linear(256, 128), "narrow": nn.Linear(48, 64), "lm_head": nn.Linear(128, 8)})


def test_native_nvfp4_keeps_layers_its_kernels_cannot_tile():
    report = NVFP4Converter(precision="nvfp4", emulated=False).classify(_net())
    assert report.converted == ["wide"]
    assert report.kept["narrow"] == "48x64 not multiples of 128 (torchao's NVFP4 kernels)"


def test_native_layers_carry_a_fixed_sign_vector_and_a_seed_per_name():
    model = _net()
    NVFP4Converter(precision="nvfp4", emulated=False).convert(model)
    layer = model["wide"]
    assert isinstance(layer, NVFP4Linear) and layer.sr_seed == _seed_of("wide") != _seed_of("narrow")
    assert len(RHT_SIGNS) == 16 and set(RHT_SIGNS) == {-1, 1}  # one Hadamard basis for every layer and rank
    assert -(2**63) <= layer.sr_seed < 2**63 and set(dict(layer.named_buffers())) == set()  # nothing to lose


def test_the_emulation_converts_sixteen_multiples():
    model = _net()
    report = NVFP4Converter(precision="nvfp4-emulated", emulated=True).convert(model)
    assert report.converted == ["wide", "narrow"] and isinstance(model["narrow"], QDQLinear)
    assert model["narrow"].format_name == "nvfp4"
