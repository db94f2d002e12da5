"""Tests for ampkit.hardware: cpuinfo parsing, device description, the GPU table, matmul timing."""

from __future__ import annotations

import math

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.hardware import (
    GPUS,
    DeviceInfo,
    describe_device,
    lookup_gpu,
    match_gpu_model,
    matmul_size_for,
    measure_matmul_flops,
    measured_peak_flops,
    parse_cpuinfo,
    parse_meminfo_total_bytes,
    peak_flops,
    pick_device,
    survey_matmul,
    throughput_note,
)
from ampkit.hardware import device as device_mod
from ampkit.hardware import matmul as matmul_mod

AVX2_ONLY_CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 avx512_bf16
"""

SAPPHIRE_RAPIDS_CPUINFO = """\
processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8 avx_vnni
"""

GRAVITON3_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm
"""


def fake_cuda_info(*, cc: tuple[int, int], gpu_model: str | None) -> DeviceInfo:
    return DeviceInfo(
        type="cuda",
        name=f"fake {gpu_model}",
        compute_capability=cc,
        native_bf16=cc >= (8, 0),
        native_fp16=cc >= (7, 0),
        has_tf32=cc >= (8, 0),
        has_fp8=cc >= (8, 9),
        cpu_flags=frozenset(),
        total_memory_bytes=16 * 1024**3,
        gpu_model=gpu_model,
        index=0,
    )


# --- /proc parsing and the CPU description -------------------------------------------------------


def test_parse_cpuinfo_reads_first_processor_only():
    cpu = parse_cpuinfo(AVX2_ONLY_CPUINFO)
    assert cpu.model_name == "AMD EPYC 7B13"
    assert cpu.flags == frozenset({"avx2"})  # processor 1's avx512_bf16 is ignored, fma etc. filtered


def test_parse_cpuinfo_keeps_only_relevant_flags():
    cpu = parse_cpuinfo(SAPPHIRE_RAPIDS_CPUINFO)
    assert cpu.flags == frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_tile"})


def test_parse_cpuinfo_handles_arm_features_and_missing_name():
    cpu = parse_cpuinfo(GRAVITON3_CPUINFO)
    assert cpu.model_name is None
    assert cpu.flags == frozenset({"bf16", "asimdhp"})


def test_parse_cpuinfo_of_unreadable_file_is_empty():
    cpu = parse_cpuinfo("")
    assert cpu.model_name is None and cpu.flags == frozenset()


@pytest.mark.parametrize(
    ("text", "bf16", "fp16"),
    [(AVX2_ONLY_CPUINFO, False, False), (SAPPHIRE_RAPIDS_CPUINFO, True, True), (GRAVITON3_CPUINFO, True, True)],
)
def test_describe_cpu_derives_native_dtypes_from_flags(text, bf16, fp16):
    info = device_mod.describe_cpu(parse_cpuinfo(text))
    assert (info.native_bf16, info.native_fp16) == (bf16, fp16)
    assert info.type == "cpu" and info.compute_capability is None
    assert not info.has_tf32 and not info.has_fp8 and info.gpu_model is None
    assert info.is_native("fp32") and info.is_native("bf16") == bf16


def test_describe_cpu_without_model_name_still_has_a_name():
    assert device_mod.describe_cpu(parse_cpuinfo("")).name


def test_parse_meminfo_total_bytes_converts_kib():
    assert parse_meminfo_total_bytes("MemTotal:       16384 kB\nMemFree: 1 kB\n") == 16384 * 1024
    assert parse_meminfo_total_bytes("garbage") is None


def test_describe_device_on_this_cpu_is_consistent():
    info = describe_device("cpu")
    assert info.type == "cpu"
    assert isinstance(info.name, str) and info.name
    assert isinstance(info.cpu_flags, frozenset)
    assert isinstance(info.total_memory_bytes, int) and info.total_memory_bytes > 0
    assert info.native_bf16 == bool(info.cpu_flags & {"avx512_bf16", "amx_bf16", "bf16"})
    assert info.native_fp16 == bool(info.cpu_flags & {"avx512_fp16", "amx_fp16", "asimdhp"})
    assert describe_device(torch.device("cpu")) == info


def test_is_native_rejects_unknown_dtype_key():
    with pytest.raises(UsageError, match="fp32"):
        describe_device("cpu").is_native("int4")


# --- pick_device -----------------------------------------------------------------------------------


def test_pick_device_auto_without_cuda_is_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device(None) == torch.device("cpu")
    assert pick_device("auto") == torch.device("cpu")
    assert pick_device("CPU") == torch.device("cpu")


def test_pick_device_cuda_without_cuda_names_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="--device cpu"):
        pick_device("cuda")


def test_pick_device_unknown_name():
    with pytest.raises(UsageError, match="auto, cpu, cuda"):
        pick_device("tpu")


# --- the GPU table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("a100", "A100-80GB"),
        ("A100-80GB", "A100-80GB"),
        ("a100_40gb", "A100-40GB"),
        ("h100", "H100-80GB"),
        ("H100 SXM", "H100-80GB"),
        ("h200", "H200"),
        ("v100", "V100-32GB"),
        ("rtx 4090", "RTX4090"),
        ("t4", "T4"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
    ],
)
def test_lookup_gpu_aliases(name, key):
    assert lookup_gpu(name).name == key


def test_lookup_gpu_unknown_lists_known_names():
    with pytest.raises(UsageError) as err:
        lookup_gpu("B200")
    assert "A100-80GB" in str(err.value) and "H200" in str(err.value)


@pytest.mark.parametrize(
    ("cuda_name", "total_gib", "key"),
    [
        ("NVIDIA H100 80GB HBM3", 79.6, "H100-80GB"),
        ("NVIDIA H100 PCIe", 79.6, None),  # different peaks than the SXM figures: no match
        ("NVIDIA GH200 480GB", 94.5, None),
        ("NVIDIA A100-PCIE", 39.4, "A100-40GB"),  # variant chosen from the reported total
        ("NVIDIA A100-SXM4", 79.2, "A100-80GB"),
        ("NVIDIA GeForce RTX 4090", 23.6, "RTX4090"),
        ("NVIDIA L4", 22.5, "L4"),
        ("NVIDIA A10", 22.1, None),
    ],
)
def test_match_gpu_model(cuda_name, total_gib, key):
    assert match_gpu_model(cuda_name, total_memory_bytes=int(total_gib * 1024**3)) == key


def test_a100_peaks_in_flops():
    spec = GPUS["A100-80GB"]
    assert spec.peak_flops("fp32") == pytest.approx(19.5e12)
    assert spec.peak_flops("fp16") == pytest.approx(312e12)
    assert spec.peak_flops("tf32") == pytest.approx(156e12)
    assert spec.peak_flops("fp8") is None
    assert spec.memory_bytes == 80 * 1024**3  # nominal GiB convention, see gpus.py


def test_peak_flops_by_device_info():
    assert peak_flops(fake_cuda_info(cc=(8, 0), gpu_model="A100-40GB"), "bf16") == pytest.approx(312e12)
    assert peak_flops(fake_cuda_info(cc=(7, 0), gpu_model="V100-16GB"), "bf16") is None  # emulated
    assert peak_flops(fake_cuda_info(cc=(9, 0), gpu_model=None), "fp32") is None  # unknown card
    assert peak_flops(describe_device("cpu"), "fp32") is None
    with pytest.raises(UsageError, match="fp16"):
        peak_flops(describe_device("cpu"), "float16")


@pytest.mark.parametrize("key", sorted(GPUS))
def test_gpu_table_is_self_consistent(key):
    spec = GPUS[key]
    assert spec.name == key
    assert spec.native_bf16 == (spec.compute_capability >= (8, 0)) == ("bf16" in spec.peak_tflops)
    assert ("fp8" in spec.peak_tflops) == (spec.compute_capability >= (8, 9))
    assert spec.peak_tflops["fp16"] > spec.peak_tflops["fp32"] > 0
    assert spec.memory_gib > 0 and spec.bandwidth_gbs > 0


# --- measured matmul throughput --------------------------------------------------------------------


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


def test_emulated_dtypes_get_smaller_matmuls():
    avx2 = device_mod.describe_cpu(parse_cpuinfo(AVX2_ONLY_CPUINFO))
    amx = device_mod.describe_cpu(parse_cpuinfo(SAPPHIRE_RAPIDS_CPUINFO))
    assert matmul_size_for(avx2, "bf16") < matmul_size_for(avx2, "fp32")
    assert matmul_size_for(amx, "bf16") == matmul_size_for(amx, "fp32")
    assert matmul_size_for(avx2, "bf16", quick=True) < matmul_size_for(avx2, "bf16")


def _fake_rates(rates: dict[torch.dtype, float], seen: list | None = None):
    def fake_measure(dtype, *, device, size, allow_tf32=False, **kwargs):
        if seen is not None:
            seen.append((dtype, allow_tf32))
        return rates[dtype] * (8.0 if allow_tf32 else 1.0)

    return fake_measure


def test_survey_on_emulated_cpu_reports_ratio_and_fix(monkeypatch):
    rates = {torch.float32: 124e9, torch.bfloat16: 0.9e9, torch.float16: 1.1e9}
    monkeypatch.setattr(matmul_mod, "measure_matmul_flops", _fake_rates(rates))
    info = device_mod.describe_cpu(parse_cpuinfo(AVX2_ONLY_CPUINFO))
    results = {entry.dtype_key: entry for entry in survey_matmul(info, torch.device("cpu"))}
    assert list(results) == ["fp32", "bf16", "fp16"]  # no tf32 on a CPU
    assert results["fp32"].ratio_vs_fp32 == 1.0
    assert results["bf16"].ratio_vs_fp32 == pytest.approx(0.9 / 124)
    note = throughput_note(info, results["bf16"])
    assert note.startswith("0.0073x fp32 — emulated")
    assert "avx512_bf16/amx_bf16" in note and "use fp32" in note


def test_survey_on_a_fake_v100_marks_tf32_unsupported(monkeypatch):
    seen: list = []
    rates = {torch.float32: 14e12, torch.bfloat16: 1e12, torch.float16: 100e12}
    monkeypatch.setattr(matmul_mod, "measure_matmul_flops", _fake_rates(rates, seen))
    info = fake_cuda_info(cc=(7, 0), gpu_model="V100-16GB")
    results = {entry.dtype_key: entry for entry in survey_matmul(info, torch.device("cuda"), quick=True)}
    assert results["tf32"].measured_flops is None and "unsupported" in throughput_note(info, results["tf32"])
    assert (torch.float32, True) not in seen  # no TF32 measurement without TF32 cores
    assert results["fp16"].table_peak_flops == pytest.approx(125e12)
    assert "use fp16-mixed" in throughput_note(info, results["bf16"])


def test_survey_on_a_fake_a100_measures_tf32(monkeypatch):
    rates = {torch.float32: 19e12, torch.bfloat16: 280e12, torch.float16: 290e12}
    monkeypatch.setattr(matmul_mod, "measure_matmul_flops", _fake_rates(rates))
    info = fake_cuda_info(cc=(8, 0), gpu_model="A100-80GB")
    results = {entry.dtype_key: entry for entry in survey_matmul(info, torch.device("cuda"), quick=True)}
    assert results["tf32"].ratio_vs_fp32 == pytest.approx(8.0)
    assert throughput_note(info, results["bf16"]).endswith("native, faster than fp32")


# --- on a real GPU ---------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_describe_and_measure_on_cuda():
    info = describe_device("cuda")
    assert info.type == "cuda" and info.index is not None
    assert info.has_tf32 == (info.compute_capability >= (8, 0))
    assert info.total_memory_bytes == torch.cuda.get_device_properties(info.index).total_memory
    flops = measure_matmul_flops(torch.float16, device="cuda", size=2048, min_time_s=0.05)
    assert math.isfinite(flops) and flops > 0
    if info.native_fp16:
        assert flops > 1e12  # any tensor-core GPU exceeds 1 TFLOP/s in fp16
    if info.gpu_model is not None:
        assert flops <= 1.2 * peak_flops(info, "fp16")  # a measurement can't beat the data sheet
