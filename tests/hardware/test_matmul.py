"""Tests for ampkit.hardware.matmul: measured matmul throughput and the dtype survey."""

from __future__ import annotations

import math

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.hardware import device as device_mod
from ampkit.hardware import matmul as matmul_mod
from ampkit.hardware.device import parse_cpuinfo
from ampkit.hardware.matmul import (
    matmul_size_for,
    measure_matmul_flops,
    measured_peak_flops,
    survey_matmul,
    throughput_note,
)


def test_measure_matmul_flops_fp32_is_positive_and_finite():
    flops = measure_matmul_flops(torch.float32, device="cpu", size=64, min_time_s=0.01, warmup=1)
    assert math.isfinite(flops) and flops > 0


def test_measure_matmul_flops_bf16_tiny():
    flops = measure_matmul_flops(torch.bfloat16, device="cpu", size=16, min_time_s=0.005, warmup=0)
    assert math.isfinite(flops) and flops > 0


def test_measure_matmul_restores_fp32_matmul_precision():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        measure_matmul_flops(torch.float32, device="cpu", size=16, min_time_s=0.005)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize(
    "kwargs",
    [{"size": 0}, {"min_time_s": 0.0}, {"min_time_s": float("nan")}, {"warmup": -1}, {"allow_tf32": True}],
)
def test_measure_matmul_flops_rejects_bad_arguments(kwargs):
    with pytest.raises(UsageError):
        measure_matmul_flops(torch.float32, device="cpu", **kwargs)


def test_measured_peak_flops_is_measured_once_per_device(monkeypatch):
    calls = []

    def fake_measure(dtype, *, device, size, **kwargs):
        calls.append((dtype, torch.device(device).type, size))
        return 1.5e11

    monkeypatch.setattr(matmul_mod, "measure_matmul_flops", fake_measure)
    matmul_mod._measured_peak_flops.cache_clear()
    try:
        assert measured_peak_flops("cpu") == 1.5e11
        assert measured_peak_flops(torch.device("cpu")) == 1.5e11
        assert calls == [(torch.float32, "cpu", matmul_mod.CPU_SIZE)]
    finally:
        matmul_mod._measured_peak_flops.cache_clear()


def test_emulated_dtypes_get_smaller_matmuls(cpuinfo):
    avx2 = device_mod.describe_cpu(parse_cpuinfo(cpuinfo["avx2"]))
    amx = device_mod.describe_cpu(parse_cpuinfo(cpuinfo["sapphire_rapids"]))
    assert matmul_size_for(avx2, "bf16") < matmul_size_for(avx2, "fp32")
    assert matmul_size_for(amx, "bf16") == matmul_size_for(amx, "fp32")
    assert matmul_size_for(avx2, "bf16", quick=True) < matmul_size_for(avx2, "bf16")


def _fake_rates(rates: dict[torch.dtype, float], seen: list | None = None):
    def fake_measure(dtype, *, device, size, allow_tf32=False, **kwargs):
        if seen is not None:
            seen.append((dtype, allow_tf32))
        return rates[dtype] * (8.0 if allow_tf32 else 1.0)

    return fake_measure


def test_survey_on_emulated_cpu_reports_ratio_and_fix(monkeypatch, cpuinfo):
    rates = {torch.float32: 124e9, torch.bfloat16: 0.9e9, torch.float16: 1.1e9}
    monkeypatch.setattr(matmul_mod, "measure_matmul_flops", _fake_rates(rates))
    info = device_mod.describe_cpu(parse_cpuinfo(cpuinfo["avx2"]))
    results = {entry.dtype_key: entry for entry in survey_matmul(info, torch.device("cpu"))}
    assert list(results) == ["fp32", "bf16", "fp16"]  # no tf32 on a CPU
    assert results["fp32"].ratio_vs_fp32 == 1.0
    assert results["bf16"].ratio_vs_fp32 == pytest.approx(0.9 / 124)
    note = throughput_note(info, results["bf16"])
    assert note.startswith("0.0073x fp32 — emulated")
    assert "avx512_bf16/amx_bf16" in note and "use fp32" in note


def test_survey_on_a_fake_v100_marks_tf32_unsupported(monkeypatch, fake_cuda_info):
    seen: list = []
    rates = {torch.float32: 14e12, torch.bfloat16: 1e12, torch.float16: 100e12}
    monkeypatch.setattr(matmul_mod, "measure_matmul_flops", _fake_rates(rates, seen))
    info = fake_cuda_info(cc=(7, 0), gpu_model="V100-16GB")
    results = {entry.dtype_key: entry for entry in survey_matmul(info, torch.device("cuda"), quick=True)}
    assert results["tf32"].measured_flops is None and "unsupported" in throughput_note(info, results["tf32"])
    assert (torch.float32, True) not in seen  # no TF32 measurement without TF32 cores
    assert results["fp16"].table_peak_flops == pytest.approx(125e12)
    assert "use fp16-mixed" in throughput_note(info, results["bf16"])


def test_survey_on_a_fake_a100_measures_tf32(monkeypatch, fake_cuda_info):
    rates = {torch.float32: 19e12, torch.bfloat16: 280e12, torch.float16: 290e12}
    monkeypatch.setattr(matmul_mod, "measure_matmul_flops", _fake_rates(rates))
    info = fake_cuda_info(cc=(8, 0), gpu_model="A100-80GB")
    results = {entry.dtype_key: entry for entry in survey_matmul(info, torch.device("cuda"), quick=True)}
    assert results["tf32"].ratio_vs_fp32 == pytest.approx(8.0)
    assert throughput_note(info, results["bf16"]).endswith("native, faster than fp32")
