"""The bench's device defaults on every kind of device (synthetic ROCm, XPU and MPS devices, `tests/devices.py`):
which precisions a plain `ampkit bench` compares, in which order, on what shape, and the MFU denominator."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from ampkit.bench.config import BenchConfig, default_precisions, resolve_for_device
from ampkit.bench.peaks import measure_peaks
from ampkit.bench.recommend import native_support
from ampkit.errors import UsageError
from ampkit.hardware import describe_device
from ampkit.precision import get_spec
from devices import synthetic_device

FP8 = ["fp8"] if importlib.util.find_spec("torchao") is not None else []  # fp8 joins when torchao is installed


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("a100", ["fp32", "tf32", "fp16-mixed", "bf16-mixed"]),  # the CUDA path as before
        ("mi100", ["fp32", "fp16-mixed"]),
        ("mi250x", ["fp32", "fp16-mixed", "bf16-mixed"]),
        ("mi300x", ["fp32", "tf32", "fp16-mixed", "bf16-mixed", *FP8]),
        ("xpu-max", ["fp32", "fp16-mixed", "bf16-mixed"]),
        ("xpu-no-bf16", ["fp32", "fp16-mixed"]),
        ("mps", ["fp32", "fp16-mixed", "bf16-mixed"]),
        ("mps-macos13", ["fp32", "fp16-mixed"]),
    ],
)
def test_default_precisions_are_what_the_device_runs(device, expected):
    assert default_precisions(synthetic_device(device)) == expected


@pytest.mark.parametrize("device", ["a100", "mi250x", "mi300x", "xpu-max", "mps", "cpu"])
def test_the_first_mixed_precision_is_torchs_autocast_default(device):
    info = describe_device("cpu") if device == "cpu" else synthetic_device(device)
    first_mixed = next(name for name in default_precisions(info) if get_spec(name).autocast)
    assert get_spec(first_mixed).compute_dtype == info.autocast_dtype == torch.get_autocast_dtype(info.type)


@pytest.mark.parametrize("device", ["mi300x", "xpu-max", "mps"])
def test_accelerators_bench_the_gpu_shape(device):
    resolved, names, warnings = resolve_for_device(BenchConfig(), synthetic_device(device))
    assert (resolved.model.model, resolved.data.seq_len, resolved.data.batch_size) == ("gpt2-124m", 512, 16)
    assert names[0] == "fp32" and warnings == []


def test_a_precision_the_device_lacks_is_refused_before_any_worker():
    with pytest.raises(UsageError, match=r"tf32 needs .*Apple arm64 GPU \(mps\) has none.*: use fp32"):
        resolve_for_device(BenchConfig(precisions="tf32"), synthetic_device("mps"))
    with pytest.raises(UsageError, match=r"bf16-mixed needs native bf16.*AMD Instinct MI100 \(gfx908\)"):
        resolve_for_device(BenchConfig(precisions="bf16-mixed"), synthetic_device("mi100"))


def test_native_notes_name_the_architecture():
    assert native_support(synthetic_device("mi300x"), get_spec("bf16-mixed")) == (True, "native on gfx942")
    assert native_support(synthetic_device("a100"), get_spec("fp16-mixed")) == (True, "native on sm_80")
    assert native_support(synthetic_device("mps"), get_spec("bf16-mixed")) == (True, "native on mps")


def test_mfu_denominator_on_a_table_card_is_its_data_sheet_peak():
    cpu = torch.device("cpu")  # the table answers first: no probe runs (emptying the cache is the host's no-op)
    mi300x = measure_peaks(synthetic_device("mi300x"), ["bf16-mixed"], cpu)["bf16"]
    assert mi300x == {"peak_flops": pytest.approx(1307.4e12), "source": "gpu-table", "dtype": "bf16"}
    l40s = measure_peaks(synthetic_device("l40s"), ["fp8"], cpu)["fp8"]
    assert l40s["peak_flops"] == pytest.approx(733e12) and l40s["source"] == "gpu-table"
