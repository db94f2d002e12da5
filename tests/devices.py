"""Synthetic descriptions of the devices ampkit knows and this CPU machine lacks (importable: pytest's
`pythonpath` includes tests/).

Each one goes through `ampkit.hardware.device.info_from_facts`, the path a real device takes once
torch has reported its facts (compute capability, gfx architecture, whether bf16 is supported), so a
test exercises ampkit's rules, not a DeviceInfo filled in by hand. Names and totals are what torch
reports on those cards (totals in GiB, ~1-6% under nominal after driver and ECC reservations).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import ampkit.hardware.device as device_mod
from ampkit.hardware import DeviceInfo, parse_cpuinfo
from ampkit.hardware.capabilities import DeviceFacts
from ampkit.hardware.device import describe_cpu, info_from_facts

GIB = 1024**3

SYNTHETIC: dict[str, tuple[DeviceFacts, str, float]] = {
    # NVIDIA (CUDA)
    "v100": (DeviceFacts(kind="cuda", compute_capability=(7, 0)), "Tesla V100-SXM2-16GB", 15.8),
    "a100": (DeviceFacts(kind="cuda", compute_capability=(8, 0)), "NVIDIA A100-SXM4-80GB", 79.2),
    "l40s": (DeviceFacts(kind="cuda", compute_capability=(8, 9)), "NVIDIA L40S", 44.5),
    "b200": (DeviceFacts(kind="cuda", compute_capability=(10, 0)), "NVIDIA B200", 178.4),
    # AMD (ROCm: torch type "cuda", the rules read the gfx architecture)
    "mi100": (
        DeviceFacts(kind="rocm", compute_capability=(9, 0), arch="gfx908:sramecc+:xnack-"),
        "AMD Instinct MI100",
        32.0,
    ),
    "mi250x": (
        DeviceFacts(kind="rocm", compute_capability=(9, 0), arch="gfx90a:sramecc+:xnack-"),
        "AMD Instinct MI250X",
        64.0,
    ),
    "mi300x": (
        DeviceFacts(kind="rocm", compute_capability=(9, 4), arch="gfx942:sramecc+:xnack-"),
        "AMD Instinct MI300X",
        192.0,
    ),
    # Intel (XPU)
    "xpu-max": (DeviceFacts(kind="xpu", bf16_reported=True), "Intel(R) Data Center GPU Max 1550", 64.0),
    "xpu-no-bf16": (DeviceFacts(kind="xpu", bf16_reported=False), "Intel(R) UHD Graphics 770", 12.0),
    # Apple (MPS): bf16 from macOS 14
    "mps": (DeviceFacts(kind="mps", bf16_reported=True), "Apple arm64 GPU", 21.3),
    "mps-macos13": (DeviceFacts(kind="mps", bf16_reported=False), "Apple arm64 GPU", 10.7),
}


def synthetic_device(key: str) -> DeviceInfo:
    """The DeviceInfo ampkit would build on device `key` of `SYNTHETIC`."""
    facts, name, total_gib = SYNTHETIC[key]
    return info_from_facts(facts, name=name, total_memory_bytes=int(total_gib * GIB), index=0)


# The two CPU kinds these machines come in (the kind changes between sessions; CI runs on either), as
# /proc/cpuinfo shows them. ampkit decides "bf16/fp16 native or emulated" from these flags alone
# (`ampkit.hardware.device.read_cpuinfo`), so a test pinned to a kind takes that kind's branches on any machine;
# only the kernels' speed stays this machine's.
CPU_KINDS: dict[str, str] = {
    # AMD EPYC, AVX2 only: bf16 and fp16 matmuls emulated (~10x slower than fp32)
    "avx2": "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n",
    # Intel Xeon with AMX-BF16 and AVX512-FP16: both native
    "amx": "model name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 avx512_fp16 amx_tile\n",
}


def cpu_of(kind: str) -> DeviceInfo:
    """The CPU DeviceInfo ampkit builds on a machine of `kind` ("avx2" or "amx")."""
    return describe_cpu(parse_cpuinfo(CPU_KINDS[kind]))


def cpuinfo_file(kind: str) -> Path:
    """A file holding `kind`'s /proc/cpuinfo text (written once per machine; the same bytes every time)."""
    path = Path(tempfile.gettempdir()) / f"ampkit-tests-cpuinfo-{kind}"
    if not path.exists() or path.read_text() != CPU_KINDS[kind]:
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(CPU_KINDS[kind])
        os.replace(tmp, path)  # atomic: two xdist workers may write it at once
    return path


def pin_cpu_kind(monkeypatch, kind: str) -> DeviceInfo:
    """Make every `describe_device`/`describe_cpu` see a CPU of `kind` (the facts, not the speed): in this process
    and in the commands a test starts as processes (bench workers, ranks), through `$AMPKIT_CPUINFO`."""
    monkeypatch.setenv(device_mod.CPUINFO_ENV, str(cpuinfo_file(kind)))
    return cpu_of(kind)
