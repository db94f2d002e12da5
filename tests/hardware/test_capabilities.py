"""ampkit.hardware.capabilities: native dtypes, TF32 and FP8 per device kind, from synthetic facts."""

from __future__ import annotations

import pytest
import torch

from ampkit.hardware.capabilities import KINDS, DeviceFacts, absence_note, arch_label, capabilities, rocm_arch
from devices import SYNTHETIC, synthetic_device


@pytest.mark.parametrize(
    ("cc", "bf16", "fp16", "tf32", "fp8", "mx"),
    [
        ((6, 1), False, False, False, False, False),  # Pascal
        ((7, 0), False, True, False, False, False),  # Volta
        ((7, 5), False, True, False, False, False),  # Turing
        ((8, 0), True, True, True, False, False),  # A100
        ((8, 6), True, True, True, False, False),  # A10G, RTX 3090, RTX A6000
        ((8, 9), True, True, True, True, False),  # L4, L40S, RTX 4090: fp8, no block-scaled MMA
        ((9, 0), True, True, True, True, False),  # H100
        ((10, 0), True, True, True, True, True),  # B200, GB200: MXFP8, MXFP4, NVFP4
    ],
)
def test_cuda_capabilities_follow_the_compute_capability(cc, bf16, fp16, tf32, fp8, mx):
    caps = capabilities(DeviceFacts(kind="cuda", compute_capability=cc))
    got = (caps.native_bf16, caps.native_fp16, caps.has_tf32, caps.has_fp8, caps.has_mx)
    assert got == (bf16, fp16, tf32, fp8, mx)


@pytest.mark.parametrize(
    ("arch", "bf16", "tf32", "fp8"),
    [
        ("gfx906", False, False, False),  # MI50/MI60
        ("gfx908:sramecc+:xnack-", False, False, False),  # MI100: bf16 counted from MI200
        ("gfx90a:sramecc+:xnack-", True, False, False),  # MI210/MI250/MI250X
        ("gfx942:sramecc+:xnack-", True, True, True),  # MI300X/MI300A/MI325X: XF32, fnuz float8
        ("gfx950", True, False, True),  # MI350/MI355X: OCP float8, no XF32
        ("gfx1100", True, False, False),  # Radeon RX 7900 (RDNA3 WMMA)
    ],
)
def test_rocm_capabilities_follow_the_gfx_architecture(arch, bf16, tf32, fp8):
    caps = capabilities(DeviceFacts(kind="rocm", compute_capability=(9, 0), arch=arch))
    assert (caps.native_bf16, caps.has_tf32, caps.has_fp8) == (bf16, tf32, fp8)
    assert caps.native_fp16


@pytest.mark.parametrize("kind", ["xpu", "mps"])
@pytest.mark.parametrize("bf16", [True, False])
def test_xpu_and_mps_take_bf16_from_torch_and_have_no_tf32_or_fp8(kind, bf16):
    caps = capabilities(DeviceFacts(kind=kind, bf16_reported=bf16))
    assert caps.native_bf16 is bf16 and caps.native_fp16
    assert not caps.has_tf32 and not caps.has_fp8


def test_facts_refuse_what_the_rules_cannot_read():
    with pytest.raises(ValueError, match="compute capability"):
        DeviceFacts(kind="cuda")
    with pytest.raises(ValueError, match="gcnArchName"):
        DeviceFacts(kind="rocm", compute_capability=(9, 4))
    with pytest.raises(ValueError, match="one of: cuda, rocm, xpu, mps"):
        DeviceFacts(kind="tpu")
    with pytest.raises(ValueError):
        DeviceFacts(kind="cpu")  # the CPU is described from its flags


def test_rocm_arch_drops_the_feature_flags():
    assert rocm_arch("gfx90a:sramecc+:xnack-") == "gfx90a"
    assert rocm_arch(" GFX942 ") == "gfx942"


def test_arch_labels():
    assert arch_label("cuda", compute_capability=(8, 9), arch=None) == "sm_89"
    assert arch_label("rocm", compute_capability=(9, 4), arch="gfx942:sramecc+") == "gfx942"
    assert [arch_label(k, compute_capability=None, arch=None) for k in ("xpu", "mps", "cpu")] == ["xpu", "mps", "cpu"]


def test_every_kind_runs_as_a_torch_device_type():
    assert KINDS == {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "mps": "mps"}
    for device_type in set(KINDS.values()):
        torch.device(device_type)  # torch knows the type (even without such a device)


@pytest.mark.parametrize(("kind", "key"), [("xpu", "fp8"), ("mps", "fp8"), ("xpu", "tf32"), ("mps", "bf16")])
def test_absence_notes_say_why(kind, key):
    note = absence_note(kind, key)
    assert note and (kind.upper() in note or "macOS" in note)
    assert absence_note("cuda", "tf32") == ""  # the requirement (compute capability) says it all


def test_synthetic_devices_cover_every_accelerator_kind():
    assert {facts.kind for facts, _, _ in SYNTHETIC.values()} == {"cuda", "rocm", "xpu", "mps"}
    mi300x = synthetic_device("mi300x")
    assert (mi300x.type, mi300x.kind, mi300x.arch, mi300x.gpu_model) == ("cuda", "rocm", "gfx942", "MI300X")
