"""Tests for ampkit.hardware.device: /proc parsing, the device description, pick_device."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.hardware import device as device_mod
from ampkit.hardware.device import describe_device, parse_cpuinfo, parse_meminfo_total_bytes, pick_device
from ampkit.hardware.gpus import peak_flops
from ampkit.hardware.matmul import measure_matmul_flops
from devices import synthetic_device

# --- /proc parsing and the CPU description -------------------------------------------------------


def test_parse_cpuinfo_reads_first_processor_only(cpuinfo):
    cpu = parse_cpuinfo(cpuinfo["avx2"])
    assert cpu.model_name == "AMD EPYC 7B13"
    assert cpu.flags == frozenset({"avx2"})  # processor 1's avx512_bf16 is ignored, fma etc. filtered


def test_parse_cpuinfo_keeps_only_relevant_flags(cpuinfo):
    cpu = parse_cpuinfo(cpuinfo["sapphire_rapids"])
    assert cpu.flags == frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_tile"})


def test_parse_cpuinfo_handles_arm_features_and_missing_name(cpuinfo):
    cpu = parse_cpuinfo(cpuinfo["graviton3"])
    assert cpu.model_name is None
    assert cpu.flags == frozenset({"bf16", "asimdhp"})


def test_parse_cpuinfo_of_unreadable_file_is_empty():
    cpu = parse_cpuinfo("")
    assert cpu.model_name is None and cpu.flags == frozenset()


@pytest.mark.parametrize(
    ("cpu", "bf16", "fp16"),
    [("avx2", False, False), ("sapphire_rapids", True, True), ("graviton3", True, True)],
)
def test_describe_cpu_derives_native_dtypes_from_flags(cpuinfo, cpu, bf16, fp16):
    info = device_mod.describe_cpu(parse_cpuinfo(cpuinfo[cpu]))
    assert (info.native_bf16, info.native_fp16) == (bf16, fp16)
    assert info.type == "cpu" and info.compute_capability is None
    assert not info.has_tf32 and not info.has_fp8 and info.gpu_model is None
    assert info.is_native("fp32") and info.is_native("bf16") == bf16


def test_describe_cpu_without_model_name_still_has_a_name():
    assert device_mod.describe_cpu(parse_cpuinfo("")).name


def test_ampkit_cpuinfo_names_the_file_read_instead_of_proc_cpuinfo(tmp_path, monkeypatch, cpuinfo):
    """`$AMPKIT_CPUINFO`: what ampkit decides on another CPU, in this process and in every process it starts."""
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo["sapphire_rapids"])
    monkeypatch.setenv(device_mod.CPUINFO_ENV, str(path))
    assert device_mod.read_cpuinfo() == parse_cpuinfo(cpuinfo["sapphire_rapids"])
    code = (
        "from ampkit.hardware import describe_device; d = describe_device('cpu'); print(d.native_bf16, d.native_fp16)"
    )
    for kind, expected in (("sapphire_rapids", "True True"), ("avx2", "False False")):
        path.write_text(cpuinfo[kind])
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.stdout.strip() == expected, proc.stderr[-2000:]
    monkeypatch.setenv(device_mod.CPUINFO_ENV, "")  # empty: /proc/cpuinfo again
    assert device_mod.read_cpuinfo() == parse_cpuinfo(device_mod._read_text(device_mod.CPUINFO_PATH))


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


def test_pick_device_auto_picks_the_accelerator_torch_reports(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("xpu"))
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    assert pick_device("auto") == torch.device("xpu")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)  # built for XPU, none present
    assert pick_device("auto") == torch.device("cpu")


@pytest.mark.parametrize(("spec", "fix"), [("xpu", "Intel GPU"), ("xpu:1", "Intel GPU"), ("mps", "Apple silicon")])
def test_pick_device_missing_accelerator_names_the_fix(monkeypatch, spec, fix):
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setattr(torch.mps, "is_available", lambda: False)
    with pytest.raises(UsageError, match=f"--device {spec}: ") as err:
        pick_device(spec)
    assert fix in str(err.value) and "use --device cpu" in str(err.value)


def test_pick_device_checks_the_accelerator_index(monkeypatch):
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)
    assert pick_device("xpu:1") == torch.device("xpu", 1)
    with pytest.raises(UsageError, match="xpu:0..xpu:1"):
        pick_device("xpu:2")


# --- synthetic accelerators (ampkit's rules on what torch would report) ------------------------------


@pytest.mark.parametrize(
    ("key", "kind", "gpu_model", "where"),
    [
        ("a100", "cuda", "A100-80GB", "NVIDIA A100-SXM4-80GB (sm_80)"),
        ("l40s", "cuda", "L40S", "NVIDIA L40S (sm_89)"),
        ("b200", "cuda", "B200", "NVIDIA B200 (sm_100)"),
        ("mi250x", "rocm", "MI250X", "AMD Instinct MI250X (gfx90a)"),
        ("mi300x", "rocm", "MI300X", "AMD Instinct MI300X (gfx942)"),
        ("mi100", "rocm", None, "AMD Instinct MI100 (gfx908)"),  # not in the GPU table
        ("xpu-max", "xpu", None, "Intel(R) Data Center GPU Max 1550 (xpu)"),
        ("mps", "mps", None, "Apple arm64 GPU (mps)"),
    ],
)
def test_synthetic_accelerators_are_described(key, kind, gpu_model, where):
    info = synthetic_device(key)
    assert (info.kind, info.gpu_model, info.where) == (kind, gpu_model, where)
    assert info.type == ("cuda" if kind == "rocm" else kind)


@pytest.mark.parametrize(
    ("key", "dtype"),
    [("a100", torch.float16), ("mi300x", torch.float16), ("xpu-max", torch.float16), ("mps", torch.float16)],
)
def test_autocast_default_is_torchs_per_device_type(key, dtype):
    assert synthetic_device(key).autocast_dtype == dtype
    assert describe_device("cpu").autocast_dtype == torch.bfloat16  # torch's CPU default


def test_device_info_kind_must_run_as_its_type():
    cpu = describe_device("cpu")
    assert cpu.kind == "cpu" and cpu.where == "this CPU" and cpu.arch_label == "cpu"
    with pytest.raises(ValueError, match="rocm"):
        dataclasses.replace(cpu, kind="rocm")  # ROCm runs as torch type "cuda"
    assert dataclasses.replace(cpu, type="cuda", kind="rocm", arch="gfx942").kind == "rocm"
    assert dataclasses.replace(synthetic_device("a100"), kind="").kind == "cuda"  # '' = the type


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
