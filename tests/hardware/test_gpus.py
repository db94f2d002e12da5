"""Tests for ampkit.hardware.gpus: the GPU table, name lookup, peaks by device."""

from __future__ import annotations

import pytest

from ampkit.errors import UsageError
from ampkit.hardware.device import describe_device
from ampkit.hardware.gpus import GPUS, lookup_gpu, match_gpu_model, peak_flops


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


def test_peak_flops_by_device_info(fake_cuda_info):
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
