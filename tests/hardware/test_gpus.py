"""Tests for ampkit.hardware.gpus: the GPU table, name lookup (ambiguous families refused), peaks by device."""

from __future__ import annotations

import itertools

import pytest

from ampkit.errors import UsageError
from ampkit.hardware.capabilities import DeviceFacts, capabilities
from ampkit.hardware.device import describe_device
from ampkit.hardware.gpus import GPUS, PEAK_KEYS, lookup_gpu, match_gpu_model, peak_flops


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("A100-80GB", "A100-80GB"),
        ("a100_40gb", "A100-40GB"),
        ("h100", "H100-80GB"),
        ("H100 SXM", "H100-80GB"),
        ("h200", "H200"),
        ("rtx 4090", "RTX4090"),
        ("t4", "T4"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("a10g", "A10G"),
        ("L40S", "L40S"),
        ("rtx_3090", "RTX3090"),
        ("RTX A6000", "RTX-A6000"),
        ("a6000", "RTX-A6000"),
        ("b200", "B200"),
        ("MI250X", "MI250X"),
        ("mi300x", "MI300X"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_lookup_gpu_aliases(name, key):
    assert lookup_gpu(name).name == key


def test_lookup_gpu_unknown_lists_known_names():
    with pytest.raises(UsageError) as err:
        lookup_gpu("Z100", unknown_hint="or give --gpu-mem")
    assert "A100-80GB" in str(err.value) and "MI300X" in str(err.value) and "or give --gpu-mem" in str(err.value)


@pytest.mark.parametrize(
    ("name", "variants"),
    [
        ("A100", "A100-40GB, A100-80GB"),  # once silently the 80GB card
        ("v100", "V100-16GB, V100-32GB"),
        ("NVIDIA A100-SXM4", "A100-40GB, A100-80GB"),  # a device name whose size is not in it
    ],
)
def test_lookup_gpu_refuses_a_family_of_several_variants(name, variants):
    with pytest.raises(UsageError, match=f"GPU {name!r} matches several variants: {variants}; name one"):
        lookup_gpu(name)


def test_a_neighbours_name_is_not_a_match():
    for name in ("MI250", "A10", "L40", "H100 PCIe"):
        with pytest.raises(UsageError, match="unknown GPU"):
            lookup_gpu(name)


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
        ("NVIDIA A10G", 22.5, "A10G"),
        ("NVIDIA L40S", 44.5, "L40S"),
        ("NVIDIA L40", 44.5, None),
        ("NVIDIA GeForce RTX 3090", 23.7, "RTX3090"),
        ("NVIDIA GeForce RTX 3090 Ti", 23.7, None),
        ("NVIDIA RTX A6000", 47.5, "RTX-A6000"),
        ("NVIDIA B200", 178.4, "B200"),
        ("NVIDIA GB200", 184.0, "GB200"),  # its own row (GB200 NVL72 sheet), never B200's figures
        ("AMD Instinct MI300X", 191.5, "MI300X"),
        ("AMD Instinct MI300X VF", 191.5, "MI300X"),  # a cloud's virtual function: the same card
        ("AMD Instinct MI300A", 128.0, None),
        ("AMD Instinct MI250X", 64.0, "MI250X"),
        ("AMD Instinct MI250X/MI250", 64.0, None),  # ROCm's one name for two cards with different peaks
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
def test_gpu_table_agrees_with_the_capability_rules(key):
    """A row's peak columns are the dtypes its architecture runs natively (`capabilities.py`)."""
    spec = GPUS[key]
    assert spec.name == key and spec.vendor in ("NVIDIA", "AMD")
    if spec.vendor == "NVIDIA":
        facts = DeviceFacts(kind="cuda", compute_capability=spec.compute_capability)
        assert spec.arch == "sm_{}{}".format(*spec.compute_capability)
    else:
        facts = DeviceFacts(kind="rocm", arch=spec.arch)
    caps = capabilities(facts)
    assert spec.native_bf16 == caps.native_bf16 == ("bf16" in spec.peak_tflops)
    assert ("fp8" in spec.peak_tflops) == caps.has_fp8
    assert ("fp4" in spec.peak_tflops) == caps.has_mx == spec.block_scaled  # Blackwell's block-scaled MMA
    assert (spec.peak_flops("mxfp8") is not None) == caps.has_mx  # MXFP8 at the fp8 figure, Blackwell only
    assert ("tf32" in spec.peak_tflops) == caps.has_tf32
    assert spec.peak_tflops["fp16"] > spec.peak_tflops["fp32"] > 0
    assert set(spec.peak_tflops) <= set(PEAK_KEYS)
    assert spec.memory_gib > 0 and spec.bandwidth_gbs > 0 and spec.source


@pytest.mark.parametrize("key", sorted(GPUS))
def test_peaks_rise_as_precision_falls(key):
    """Dense matrix-unit peaks about double at each step down (tf32 -> bf16 -> fp8 -> fp4): a row that
    mixed a sparse figure into dense ones would break this (data sheets round, hence 1.95)."""
    peaks = GPUS[key].peak_tflops
    chain = [peaks[k] for k in ("tf32", "bf16", "fp8", "fp4") if k in peaks]
    assert all(1.95 * a <= b <= 2.05 * a for a, b in itertools.pairwise(chain))


def test_new_rows_carry_their_datasheet_figures():
    assert GPUS["B200"].peak_flops("fp4") == pytest.approx(9000e12) and GPUS["B200"].peak_flops("fp8") == pytest.approx(
        4500e12
    )
    assert GPUS["MI300X"].memory_bytes == 192 * 1024**3 and GPUS["MI300X"].peak_flops("bf16") == pytest.approx(
        1307.4e12
    )
    assert GPUS["MI250X"].memory_gib == 64  # one GCD: torch sees the module as two devices
    assert GPUS["L40S"].peak_flops("fp8") == pytest.approx(733e12) and GPUS["A10G"].peak_flops("fp8") is None
    assert GPUS["A100-40GB"].memory_bytes == 40 * 1024**3
    assert GPUS["A100-80GB"].peak_flops("fp4") is None
