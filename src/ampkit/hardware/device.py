"""What the device at hand can do: name, memory, native low-precision dtypes, TF32, FP8.

`describe_device()` answers from the device itself (CUDA properties, or the host's
/proc/cpuinfo and /proc/meminfo); `pick_device()` turns a `--device` flag into a
`torch.device`, refusing what this machine lacks with the fix in the message.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from ampkit.errors import UsageError
from ampkit.hardware.gpus import match_gpu_model

# The CPU flags that decide whether low-precision matmuls are native on this host.
# x86: AVX512-BF16 / AMX-BF16 give native bf16, AVX512-FP16 / AMX-FP16 native fp16.
# aarch64 (/proc/cpuinfo "Features"): "bf16" (Armv8.6 BF16), "asimdhp" (half-precision SIMD).
RELEVANT_CPU_FLAGS = frozenset(
    {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "amx_tile", "bf16", "asimdhp"}
)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
FP16_CPU_FLAGS = ("avx512_fp16", "amx_fp16", "asimdhp")

GIB = 1024**3  # GiB is 1024**3 bytes, GB is 1000**3


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
    """"cpu" or "cuda"."""
    name: str
    """CPU model name from /proc/cpuinfo, or `torch.cuda.get_device_name`."""
    compute_capability: tuple[int, int] | None
    """CUDA (major, minor), e.g. (8, 0) for A100; None on CPU."""
    native_bf16: bool
    """bf16 matmuls run in hardware: CUDA cc >= 8.0, or CPU AVX512-BF16/AMX-BF16. Else emulated (slow)."""
    native_fp16: bool
    """fp16 matmuls run in hardware: CUDA tensor cores (cc >= 7.0), or CPU AVX512-FP16/AMX-FP16."""
    has_tf32: bool
    """TF32 tensor cores exist (CUDA cc >= 8.0)."""
    has_fp8: bool
    """FP8 tensor cores exist (CUDA cc >= 8.9)."""
    cpu_flags: frozenset[str]
    """Relevant host CPU flags (see `RELEVANT_CPU_FLAGS`); empty when /proc/cpuinfo is unreadable."""
    total_memory_bytes: int
    """CUDA: device total as torch reports it. CPU: MemTotal of /proc/meminfo (or sysconf)."""
    gpu_model: str | None
    """Key into `ampkit.hardware.GPUS` when the CUDA name matches a known card; else None."""
    index: int | None = None
    """CUDA device index; None on CPU."""

    @property
    def total_memory_gib(self) -> float:
        """Total memory in GiB (1024**3 bytes)."""
        return self.total_memory_bytes / GIB

    def is_native(self, dtype_key: str) -> bool:
        """Whether compute dtype `dtype_key` ("fp32", "tf32", "bf16", "fp16", "fp8") runs in hardware."""
        native = {
            "fp32": True,
            "tf32": self.has_tf32,
            "bf16": self.native_bf16,
            "fp16": self.native_fp16,
            "fp8": self.has_fp8,
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


def describe_cpu(cpu: CpuInfo | None = None) -> DeviceInfo:
    """DeviceInfo for the host CPU; `cpu` overrides /proc/cpuinfo (tests pass a parsed string)."""
    cpu = cpu if cpu is not None else parse_cpuinfo(_read_text("/proc/cpuinfo"))
    return DeviceInfo(
        type="cpu",
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


def describe_cuda(index: int) -> DeviceInfo:
    """DeviceInfo for CUDA device `index` (CUDA must be available)."""
    name = torch.cuda.get_device_name(index)
    major, minor = torch.cuda.get_device_capability(index)
    cc = (int(major), int(minor))
    total = int(torch.cuda.get_device_properties(index).total_memory)
    return DeviceInfo(
        type="cuda",
        name=name,
        compute_capability=cc,
        native_bf16=cc >= (8, 0),
        native_fp16=cc >= (7, 0),  # tensor cores; Pascal's fp16 is native but not fast on most cards
        has_tf32=cc >= (8, 0),
        has_fp8=cc >= (8, 9),
        cpu_flags=parse_cpuinfo(_read_text("/proc/cpuinfo")).flags,  # the host's, for reference
        total_memory_bytes=total,
        gpu_model=match_gpu_model(name, total_memory_bytes=total),
        index=index,
    )


def describe_device(device: str | torch.device | None = None) -> DeviceInfo:
    """Capabilities of `device` (None or "auto": CUDA when available, else the CPU)."""
    dev = pick_device(device if not isinstance(device, torch.device) else str(device))
    if dev.type == "cuda":
        return describe_cuda(dev.index if dev.index is not None else torch.cuda.current_device())
    return describe_cpu()


def pick_device(name: str | None) -> torch.device:
    """Turn a `--device` value ("auto", "cpu", "cuda", "cuda:N") into a usable torch.device."""
    spec = (name or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        return _pick_cuda(spec)
    raise UsageError(f"unknown device {name!r}; use one of: auto, cpu, cuda, cuda:N")


def _pick_cuda(spec: str) -> torch.device:
    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {spec}: CUDA is not available here (torch {torch.__version__}); "
            "use --device cpu, or install a CUDA build of torch on a machine with an NVIDIA GPU"
        )
    if spec == "cuda":
        return torch.device("cuda")
    index_text = spec.partition(":")[2]
    count = torch.cuda.device_count()
    if not index_text.isdigit() or int(index_text) >= count:
        raise UsageError(f"--device {spec}: no such CUDA device; this machine has cuda:0..cuda:{count - 1}")
    return torch.device("cuda", int(index_text))
