"""What each kind of device runs natively, decided from what torch reports about it.

The rules are pure functions of a few reported facts (`DeviceFacts`), so every kind of device is
testable on a CPU with a synthetic description. The kinds:

| kind | torch device type | facts the rules read |
| --- | --- | --- |
| `cpu` | cpu | /proc/cpuinfo flags (`device.describe_cpu`) |
| `cuda` | cuda | compute capability (major, minor) |
| `rocm` | cuda (HIP answers torch's CUDA API) | the gfx architecture (`gcnArchName`, e.g. "gfx942:sramecc+:xnack-") |
| `xpu` | xpu | whether torch reports bf16 (`torch.xpu.is_bf16_supported`) |
| `mps` | mps | whether torch reports bf16 (`supported_dtypes` of `torch.accelerator.get_device_capability`) |

"native" means the dtype's matmuls run on the device's own matrix units, not by emulation; the
precision check refuses what is missing with these modules' `requirement` and `absence_note` texts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.formats import BLOCK_SCALED_NATIVE, FP8_NATIVE, NativeRule

KINDS: dict[str, str] = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "mps": "mps"}
"""Device kind -> the torch device type it runs as (ROCm builds of torch name AMD GPUs "cuda")."""

# The gfx architectures of AMD's data-center GPUs, by what their matrix cores do
# (AMD CDNA 2/3/4 instruction set references; float8's archs are the format registry's `FP8_NATIVE`):
ROCM_BF16_ARCHS = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")  # MI200 (CDNA2) and later, RDNA3+
ROCM_TF32_ARCHS = ("gfx94",)  # MI300's XF32; CDNA2 has none and CDNA4 (gfx950) dropped it

REQUIREMENTS: dict[str, str] = {
    "tf32": "an NVIDIA GPU with compute capability >= 8.0 (Ampere or newer) or an AMD MI300 (gfx94x, XF32)",
    "fp8": FP8_NATIVE.needs,  # the low-bit formats' requirements are the format registry's (`ampkit.formats`)
    "mxfp8": BLOCK_SCALED_NATIVE.needs,
    "fp4": BLOCK_SCALED_NATIVE.needs,
    "bf16": (
        "native bf16: an NVIDIA GPU with compute capability >= 8.0, an AMD MI200 or later (gfx90a+), "
        "or an XPU/MPS device on which torch reports bf16"
    ),
}
"""What each dtype key needs, in the words of a refusal ("tf32 needs ...")."""


@dataclass(frozen=True, kw_only=True)
class DeviceFacts:
    """What torch reports about one accelerator, reduced to what the capability rules read.

    `device.describe_device` fills it from the real device; tests write it by hand."""

    kind: str
    """"cuda", "rocm", "xpu" or "mps" (the CPU is described from its flags instead)."""
    compute_capability: tuple[int, int] | None = None
    """CUDA: (major, minor). ROCm: torch's (major, minor) of the gfx name; the rules read `arch`."""
    arch: str | None = None
    """ROCm: the gfx architecture, e.g. "gfx90a" (MI200) or "gfx942" (MI300); None elsewhere."""
    bf16_reported: bool = False
    """XPU/MPS: torch says the device supports bf16; unused on CUDA and ROCm (decided by hardware)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.kind == "cpu":
            raise ValueError(f"unknown accelerator kind {self.kind!r}; one of: cuda, rocm, xpu, mps")
        if self.kind == "cuda" and self.compute_capability is None:
            raise ValueError("a CUDA device needs its compute capability")
        if self.kind == "rocm" and not self.arch:
            raise ValueError("a ROCm device needs its gfx architecture (gcnArchName)")


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    native_bf16: bool
    native_fp16: bool
    has_tf32: bool
    has_fp8: bool
    has_mx: bool = False
    """block-scaled MMA (MXFP8, MXFP4, NVFP4) that torchao's MX/NVFP4 training kernels drive (sm100)"""


def _native(rule: NativeRule, facts: DeviceFacts) -> bool:
    """Whether the accelerator `facts` describes has the matrix units of a format's `rule`."""
    if facts.kind == "cuda":
        return rule.on_cuda(facts.compute_capability or (0, 0))
    if facts.kind == "rocm":
        return rule.on_rocm(rocm_arch(facts.arch or ""))
    return False  # XPU and MPS: torchao's low-bit training has no path there


def rocm_arch(gcn_arch_name: str) -> str:
    """ "gfx90a:sramecc+:xnack-" -> "gfx90a" (the feature flags after ':' do not change the matrix cores)."""
    return gcn_arch_name.split(":")[0].strip().lower()


def capabilities(facts: DeviceFacts) -> Capabilities:
    """Native dtypes, TF32 and FP8 of the accelerator `facts` describes."""
    if facts.kind == "cuda":
        cc = facts.compute_capability or (0, 0)
        return Capabilities(
            native_bf16=cc >= (8, 0),
            native_fp16=cc >= (7, 0),  # tensor cores; Pascal's fp16 is native but not fast on most cards
            has_tf32=cc >= (8, 0),
            has_fp8=_native(FP8_NATIVE, facts),
            has_mx=_native(BLOCK_SCALED_NATIVE, facts),
        )
    if facts.kind == "rocm":
        arch = rocm_arch(facts.arch or "")
        return Capabilities(
            native_bf16=arch.startswith(ROCM_BF16_ARCHS),
            native_fp16=True,  # every gfx9+ GPU torch's ROCm builds support has packed fp16 (MFMA from MI100)
            has_tf32=arch.startswith(ROCM_TF32_ARCHS),
            has_fp8=_native(FP8_NATIVE, facts),
            has_mx=_native(BLOCK_SCALED_NATIVE, facts),
        )
    # XPU and MPS: fp16 everywhere torch runs them; bf16 where torch says so; ampkit's tf32 switch is
    # cuBLAS/cuDNN's and its fp8 is torchao's float8 training, which has neither an XPU nor an MPS path.
    return Capabilities(native_bf16=facts.bf16_reported, native_fp16=True, has_tf32=False, has_fp8=False)


def absence_note(kind: str, dtype_key: str) -> str:
    """Why a device of `kind` lacks `dtype_key`, beyond the bare requirement ("" when nothing to add)."""
    notes = {
        ("xpu", "tf32"): "ampkit's tf32 is the cuBLAS/cuDNN switch, which XPU does not read",
        ("mps", "tf32"): "ampkit's tf32 is the cuBLAS/cuDNN switch, which MPS does not read",
        ("xpu", "fp8"): "torchao's float8 training has no XPU path (its XPU float8 is inference only)",
        ("mps", "fp8"): "MPS has no float8 matmuls and torchao's float8 training no MPS path",
        ("xpu", "bf16"): "torch reports no bf16 on it (torch.xpu.is_bf16_supported() is False)",
        ("mps", "bf16"): "torch reports no bf16 on it (MPS has bf16 from macOS 14)",
        ("rocm", "tf32"): "AMD's TF32 (XF32) exists on MI300 (gfx94x) only",
        ("rocm", "fp8"): "AMD's float8 matrix cores arrived with MI300 (gfx94x)",
        ("rocm", "bf16"): "AMD's bf16 matrix cores run at full rate from MI200 (gfx90a)",
        ("rocm", "mxfp8"): "torchao's MX training kernels are CUDA sm100 only (MI350's MX matrix cores are not driven)",
        ("rocm", "fp4"): "torchao's MX/NVFP4 training kernels are CUDA sm100 only",
        ("xpu", "mxfp8"): "torchao's MX training has no XPU path",
        ("xpu", "fp4"): "torchao's MX/NVFP4 training has no XPU path",
        ("mps", "mxfp8"): "MPS has no block-scaled matmuls",
        ("mps", "fp4"): "MPS has no block-scaled matmuls",
    }
    return notes.get((kind, dtype_key), "")


def arch_label(kind: str, *, compute_capability: tuple[int, int] | None, arch: str | None) -> str:
    """Short architecture label for messages: "sm_80", "gfx942", "xpu", "mps", "cpu"."""
    if kind == "cuda" and compute_capability is not None:
        return f"sm_{compute_capability[0]}{compute_capability[1]}"
    if kind == "rocm" and arch:
        return rocm_arch(arch)
    return kind
