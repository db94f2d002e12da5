"""What the device at hand can do: name, memory, native low-precision dtypes, TF32, FP8.

`describe_device()` answers from the device itself: CUDA and ROCm properties (HIP answers torch's
CUDA API), XPU properties, MPS's reported dtypes, or the host's /proc/cpuinfo and /proc/meminfo.
What each kind of device runs natively is decided in `capabilities.py` from those facts.
`pick_device()` turns a `--device` flag into a `torch.device`, refusing what this machine lacks with
the fix in the message; "auto" picks the accelerator torch reports, else the CPU.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from ampkit.errors import UsageError
from ampkit.hardware.capabilities import KINDS, DeviceFacts, arch_label, capabilities, rocm_arch
from ampkit.hardware.gpus import match_gpu_model

ACCELERATOR_TYPES = ("cuda", "xpu", "mps")
"""The torch device types `--device` accepts besides "cpu" (ROCm GPUs are "cuda" to torch)."""
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N, xpu, xpu:N, mps"

# The CPU flags that decide whether low-precision matmuls are native on this host.
# x86: AVX512-BF16 / AMX-BF16 give native bf16, AVX512-FP16 / AMX-FP16 native fp16.
# aarch64 (/proc/cpuinfo "Features"): "bf16" (Armv8.6 BF16), "asimdhp" (half-precision SIMD).
RELEVANT_CPU_FLAGS = frozenset(
    {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "amx_tile", "bf16", "asimdhp"}
)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
FP16_CPU_FLAGS = ("avx512_fp16", "amx_fp16", "asimdhp")

GIB = 1024**3  # GiB is 1024**3 bytes, GB is 1000**3
CPUINFO_PATH = "/proc/cpuinfo"
# A file read instead of /proc/cpuinfo where set: what ampkit would decide on another CPU kind (the test suite's
# `--cpu-kind` sets it so the commands it starts as processes, bench workers and ranks among them, see that kind).
CPUINFO_ENV = "AMPKIT_CPUINFO"


@dataclass(frozen=True, kw_only=True)
class CpuInfo:
    """The parts of /proc/cpuinfo ampkit uses."""

    model_name: str | None
    """The first "model name" line, e.g. "AMD EPYC 7B13"; None when absent (e.g. some ARM kernels)."""
    flags: frozenset[str]
    """The relevant flags (`RELEVANT_CPU_FLAGS`) present on the first processor's flags line."""


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    """Capabilities of one device, as far as precision choices are concerned."""

    type: str
    """The torch device type: "cpu", "cuda" (NVIDIA, and AMD under ROCm), "xpu" or "mps"."""
    name: str
    """CPU model name from /proc/cpuinfo, or the device name torch reports."""
    compute_capability: tuple[int, int] | None
    """CUDA (major, minor), e.g. (8, 0) for A100; on ROCm torch's (major, minor) of the gfx name
    (gfx942 -> (9, 4): not comparable with NVIDIA's, the rules read `arch`); None elsewhere."""
    native_bf16: bool
    """bf16 matmuls run in hardware: CUDA cc >= 8.0, ROCm gfx90a+, XPU/MPS where torch reports bf16,
    or CPU AVX512-BF16/AMX-BF16. Else emulated (slow). See `capabilities.py`."""
    native_fp16: bool
    """fp16 matmuls run in hardware: CUDA tensor cores (cc >= 7.0), ROCm, XPU, MPS, or CPU AVX512-FP16/AMX-FP16."""
    has_tf32: bool
    """TF32 matmul units exist and ampkit's tf32 switch reaches them (CUDA cc >= 8.0, ROCm gfx94x)."""
    has_fp8: bool
    """FP8 matmul units torchao's float8 training drives (CUDA cc >= 8.9, ROCm gfx94x/gfx950)."""
    cpu_flags: frozenset[str]
    """Relevant host CPU flags (see `RELEVANT_CPU_FLAGS`); empty when /proc/cpuinfo is unreadable."""
    total_memory_bytes: int
    """CUDA/ROCm/XPU: device total as torch reports it. MPS: Metal's recommended working set (the
    GPU shares the host's memory). CPU: MemTotal of /proc/meminfo (or sysconf)."""
    gpu_model: str | None
    """Key into `ampkit.hardware.GPUS` when the device name matches a known card; else None."""
    index: int | None = None
    """Accelerator device index; None on CPU."""
    kind: str = ""
    """The device family: "cpu", "cuda", "rocm", "xpu" or "mps" ('' = the same as `type`). ROCm is
    the one kind whose torch type ("cuda") differs."""
    arch: str | None = None
    """ROCm: the gfx architecture (e.g. "gfx90a", "gfx942"); None elsewhere."""
    has_mx: bool = False
    """Block-scaled MMA for MXFP8, MXFP4 and NVFP4 that torchao's MX/NVFP4 training drives (CUDA cc >= 10.0)."""

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", self.type)
        if KINDS.get(self.kind) != self.type:
            raise ValueError(f"device kind {self.kind!r} does not run as torch device type {self.type!r}")

    @property
    def arch_label(self) -> str:
        """ "sm_80" (CUDA), "gfx942" (ROCm), else the kind ("xpu", "mps", "cpu")."""
        return arch_label(self.kind, compute_capability=self.compute_capability, arch=self.arch)

    @property
    def where(self) -> str:
        """The device in a message: "this CPU", "NVIDIA A100-SXM4-80GB (sm_80)", "AMD Instinct MI250X (gfx90a)"."""
        return "this CPU" if self.kind == "cpu" else f"{self.name} ({self.arch_label})"

    @property
    def autocast_dtype(self) -> torch.dtype:
        """torch's default autocast dtype on this device type (CPU bf16; CUDA, XPU, MPS fp16)."""
        return torch.get_autocast_dtype(self.type)

    @property
    def total_memory_gib(self) -> float:
        """Total memory in GiB (1024**3 bytes)."""
        return self.total_memory_bytes / GIB

    def is_native(self, dtype_key: str) -> bool:
        """Whether compute dtype `dtype_key` ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "fp4") runs in
        hardware (`hardware.DTYPE_KEYS`; "fp4" is MXFP4's and NVFP4's block-scaled 4-bit MMA)."""
        native = {
            "fp32": True,
            "tf32": self.has_tf32,
            "bf16": self.native_bf16,
            "fp16": self.native_fp16,
            "fp8": self.has_fp8,
            "mxfp8": self.has_mx,
            "fp4": self.has_mx,
        }
        if dtype_key not in native:
            raise UsageError(f"unknown compute dtype {dtype_key!r}; use one of: {', '.join(native)}")
        return native[dtype_key]


def parse_cpuinfo(text: str) -> CpuInfo:
    """Read the model name and relevant flags from /proc/cpuinfo text (first processor only)."""
    model_name: str | None = None
    flags: frozenset[str] | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and model_name is None:
            model_name = value.strip() or None
        elif key in ("flags", "features") and flags is None:  # x86 "flags", aarch64 "Features"
            flags = frozenset(value.split()) & RELEVANT_CPU_FLAGS
    return CpuInfo(model_name=model_name, flags=flags or frozenset())


def parse_meminfo_total_bytes(text: str) -> int | None:
    """MemTotal from /proc/meminfo text, in bytes (the file states kB, meaning KiB = 1024 bytes)."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def host_memory_bytes() -> int:
    """Physical memory of this host in bytes: /proc/meminfo, else sysconf, else 0."""
    total = parse_meminfo_total_bytes(_read_text("/proc/meminfo"))
    if total is not None:
        return total
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform
        return 0


def read_cpuinfo() -> CpuInfo:
    """This host's CPU as /proc/cpuinfo describes it: the one source of "is bf16/fp16 native here" on a CPU
    (or the file `$AMPKIT_CPUINFO` names: how the tests run under another CPU kind's facts, tests/devices.py
    `pin_cpu_kind`)."""
    return parse_cpuinfo(_read_text(os.environ.get(CPUINFO_ENV) or CPUINFO_PATH))


def describe_cpu(cpu: CpuInfo | None = None) -> DeviceInfo:
    """DeviceInfo for the host CPU; `cpu` overrides /proc/cpuinfo (tests pass a parsed string)."""
    cpu = cpu if cpu is not None else read_cpuinfo()
    return DeviceInfo(
        type="cpu",
        kind="cpu",
        name=cpu.model_name or platform.processor() or "cpu",
        compute_capability=None,
        native_bf16=any(flag in cpu.flags for flag in BF16_CPU_FLAGS),
        native_fp16=any(flag in cpu.flags for flag in FP16_CPU_FLAGS),
        has_tf32=False,
        has_fp8=False,
        cpu_flags=cpu.flags,
        total_memory_bytes=host_memory_bytes(),
        gpu_model=None,
    )


def info_from_facts(
    facts: DeviceFacts,
    *,
    name: str,
    total_memory_bytes: int,
    index: int | None,
    cpu_flags: frozenset[str] = frozenset(),
) -> DeviceInfo:
    """DeviceInfo of an accelerator from what torch reported (`facts`); tests pass synthetic facts."""
    caps = capabilities(facts)
    known_card = facts.kind in ("cuda", "rocm")  # the GPU table holds NVIDIA and AMD cards
    return DeviceInfo(
        type=KINDS[facts.kind],
        kind=facts.kind,
        name=name,
        compute_capability=facts.compute_capability,
        arch=rocm_arch(facts.arch) if facts.arch else None,
        native_bf16=caps.native_bf16,
        native_fp16=caps.native_fp16,
        has_tf32=caps.has_tf32,
        has_fp8=caps.has_fp8,
        has_mx=caps.has_mx,
        cpu_flags=cpu_flags,
        total_memory_bytes=total_memory_bytes,
        gpu_model=match_gpu_model(name, total_memory_bytes=total_memory_bytes) if known_card else None,
        index=index,
    )


def _cuda_facts(index: int) -> tuple[DeviceFacts, str, int]:
    """NVIDIA, or AMD under a ROCm build of torch (`torch.version.hip` set; HIP answers the CUDA API)."""
    props = torch.cuda.get_device_properties(index)
    major, minor = torch.cuda.get_device_capability(index)
    cc = (int(major), int(minor))
    if torch.version.hip:
        facts = DeviceFacts(kind="rocm", compute_capability=cc, arch=str(props.gcnArchName))
    else:
        facts = DeviceFacts(kind="cuda", compute_capability=cc)
    return facts, torch.cuda.get_device_name(index), int(props.total_memory)


def _xpu_facts(index: int) -> tuple[DeviceFacts, str, int]:
    props = torch.xpu.get_device_properties(index)
    facts = DeviceFacts(kind="xpu", bf16_reported=bool(torch.xpu.is_bf16_supported()))
    return facts, str(props.name), int(props.total_memory)


def _mps_facts(index: int) -> tuple[DeviceFacts, str, int]:
    """Apple silicon: one GPU sharing the host's memory; torch names no model, so the host's chip is shown."""
    supported = torch.accelerator.get_device_capability(torch.device("mps", index)).get("supported_dtypes", ())
    facts = DeviceFacts(kind="mps", bf16_reported=torch.bfloat16 in supported)
    name = f"Apple {platform.machine() or 'silicon'} GPU"
    return facts, name, int(torch.mps.recommended_max_memory())  # the Metal working-set limit, bytes


_FACT_READERS = {"cuda": _cuda_facts, "xpu": _xpu_facts, "mps": _mps_facts}


def describe_accelerator(device: torch.device) -> DeviceInfo:
    """DeviceInfo for accelerator `device` (it must be available: see `pick_device`)."""
    index = device.index if device.index is not None else torch.accelerator.current_device_index()
    facts, name, total = _FACT_READERS[device.type](index)
    return info_from_facts(
        facts,
        name=name,
        total_memory_bytes=total,
        index=index,
        cpu_flags=read_cpuinfo().flags,  # the host's, for reference
    )


def describe_device(device: str | torch.device | None = None) -> DeviceInfo:
    """Capabilities of `device` (None or "auto": the accelerator torch reports, else the CPU)."""
    dev = pick_device(device if not isinstance(device, torch.device) else str(device))
    return describe_cpu() if dev.type == "cpu" else describe_accelerator(dev)


def accelerator_available(device_type: str) -> bool:
    """Whether torch can use a `device_type` accelerator here (its own module's answer)."""
    return bool(torch.get_device_module(device_type).is_available())


def pick_device(name: str | None) -> torch.device:
    """Turn a `--device` value (auto, cpu, cuda, cuda:N, xpu, xpu:N, mps) into a usable torch.device."""
    spec = (name or "auto").strip().lower()
    if spec == "auto":
        found = torch.accelerator.current_accelerator()  # the build's accelerator type; availability below
        usable = found is not None and accelerator_available(found.type)
        return torch.device(found.type) if found is not None and usable else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    device_type, sep, index_text = spec.partition(":")
    if device_type in ACCELERATOR_TYPES:
        return _pick_accelerator(spec, device_type, index_text if sep else None)
    raise UsageError(f"unknown device {name!r}; use one of: {DEVICE_CHOICES}")


_MISSING = {
    "cuda": (
        "CUDA is not available here (torch {version}); use --device cpu, or install a CUDA (NVIDIA) or "
        "ROCm (AMD) build of torch on a machine with that GPU"
    ),
    "xpu": "XPU is not available here (torch {version}); use --device cpu, or install torch's XPU build on a "
    "machine with an Intel GPU",
    "mps": "MPS is not available here (torch {version}); it needs Apple silicon and macOS 12.3 or newer: "
    "use --device cpu",
}


def _pick_accelerator(spec: str, device_type: str, index_text: str | None) -> torch.device:
    if not accelerator_available(device_type):
        raise UsageError(f"--device {spec}: " + _MISSING[device_type].format(version=torch.__version__))
    if index_text is None:
        return torch.device(device_type)
    count = torch.get_device_module(device_type).device_count()
    if not index_text.isdigit() or int(index_text) >= count:
        raise UsageError(
            f"--device {spec}: no such {device_type} device; this machine has "
            f"{device_type}:0..{device_type}:{count - 1}"
        )
    return torch.device(device_type, int(index_text))
