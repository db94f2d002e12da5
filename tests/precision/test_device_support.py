"""check_supported on every kind of device: what runs, what is refused, and the fix each refusal names.

The devices are synthetic (`tests/devices.py`): ampkit's capability rules applied to what torch
would report on each card, since this machine has only a CPU."""

from __future__ import annotations

import pytest

from ampkit.errors import UsageError
from ampkit.precision import SPECS, check_supported
from devices import synthetic_device

EMULATED = {name for name, spec in SPECS.items() if spec.emulated}  # every low-bit format, in software
BLOCK_SCALED = {"mxfp8", "nvfp4", "mxfp4"}
RUNS = {
    # device: every precision it runs (the -emulated ones need bf16: they run bf16 autocast around their Linears)
    "v100": {"fp32", "fp16-mixed", "fp16-true"},
    "a100": {"fp32", "tf32", "fp16-mixed", "bf16-mixed", "bf16-true", "fp16-true", *EMULATED},
    "l40s": set(SPECS) - BLOCK_SCALED,  # Ada: fp8, no block-scaled MMA
    "b200": set(SPECS) - {"mxfp4"},  # Blackwell: no MXFP4 training kernel exists (torchao's is inference only)
    "mi100": {"fp32", "fp16-mixed", "fp16-true"},
    "mi250x": {"fp32", "fp16-mixed", "bf16-mixed", "bf16-true", "fp16-true", *EMULATED},
    "mi300x": set(SPECS) - BLOCK_SCALED,
    "xpu-max": {"fp32", "fp16-mixed", "bf16-mixed", "bf16-true", "fp16-true", *EMULATED},
    "xpu-no-bf16": {"fp32", "fp16-mixed", "fp16-true"},
    "mps": {"fp32", "fp16-mixed", "bf16-mixed", "bf16-true", "fp16-true", *EMULATED},
    "mps-macos13": {"fp32", "fp16-mixed", "fp16-true"},
}


def _runs(info, name: str) -> bool:
    try:
        assert check_supported(name, info) == []  # accelerators never run a precision by emulation warnings
    except UsageError:
        return False
    return True


@pytest.mark.parametrize("device", sorted(RUNS))
def test_each_device_runs_what_its_hardware_has(device):
    info = synthetic_device(device)
    assert {name for name in SPECS if _runs(info, name)} == RUNS[device]


@pytest.mark.parametrize(
    ("device", "precision", "says"),
    [
        (
            "mi250x",
            "tf32",
            r"tf32 needs an NVIDIA GPU .*AMD MI300 \(gfx94x, XF32\); AMD Instinct MI250X \(gfx90a\) "
            r"has none \(AMD's TF32 \(XF32\) exists on MI300 \(gfx94x\) only\): use fp32",
        ),
        (
            "mi250x",
            "fp8",
            r"fp8 needs .*MI300/MI350.*; AMD Instinct MI250X \(gfx90a\) has none .*: use bf16-mixed, or "
            r"fp8-emulated",
        ),
        (
            "mi100",
            "bf16-mixed",
            r"bf16-mixed needs native bf16, which AMD Instinct MI100 \(gfx908\) lacks .*MI200.*: "
            r"use fp16-mixed",
        ),
        (
            "xpu-max",
            "tf32",
            r"tf32 needs .*; Intel\(R\) Data Center GPU Max 1550 \(xpu\) has none \(ampkit's tf32 is "
            r"the cuBLAS/cuDNN switch, which XPU does not read\): use fp32",
        ),
        (
            "xpu-max",
            "fp8",
            r"has none \(torchao's float8 training has no XPU path .*\): use bf16-mixed, or fp8-emulated",
        ),
        (
            "xpu-no-bf16",
            "bf16-true",
            r"bf16-true needs native bf16, .*is_bf16_supported\(\) is False.*: use fp16-mixed",
        ),
        ("mps", "fp8", r"Apple arm64 GPU \(mps\) has none \(MPS has no float8 matmuls .*\): use bf16-mixed"),
        ("mps", "tf32", r"\(mps\) has none \(ampkit's tf32 is the cuBLAS/cuDNN switch, which MPS does not read\)"),
        (
            "mps-macos13",
            "bf16-mixed",
            r"lacks \(torch reports no bf16 on it \(MPS has bf16 from macOS 14\)\): "
            r"use fp16-mixed",
        ),
        ("v100", "bf16-mixed", r"Tesla V100-SXM2-16GB \(sm_70\) lacks: use fp16-mixed"),  # the CUDA path as before
        ("v100", "fp8", r"compute capability >= 8.9.*\(sm_70\) has none: use bf16-mixed"),
        (
            "l40s",
            "mxfp8",
            r"mxfp8 needs an NVIDIA Blackwell GPU \(compute capability >= 10.0: B200, GB200\).*; NVIDIA L40S "
            r"\(sm_89\) has none: use bf16-mixed, or mxfp8-emulated",
        ),
        (
            "mi300x",
            "nvfp4",
            r"nvfp4 needs .*Blackwell.*\(gfx942\) has none \(torchao.s MX/NVFP4 .*\): "
            r"use bf16-mixed, or nvfp4-emulated",
        ),
        ("b200", "mxfp4", r"mxfp4: torchao 0.18 ships MXFP4 for inference only.*: use mxfp4-emulated"),
    ],
)
def test_refusals_name_the_device_the_reason_and_the_fix(device, precision, says):
    with pytest.raises(UsageError, match=says):
        check_supported(precision, synthetic_device(device))


def test_fp8_emulated_is_the_way_to_exercise_fp8_on_mps_and_xpu():
    for device in ("mps", "xpu-max", "mi250x"):
        assert check_supported("fp8-emulated", synthetic_device(device)) == []
