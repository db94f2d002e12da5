"""Public dense (no sparsity) specs of common training GPUs: the peak FLOP/s table.

Sources: NVIDIA's data sheets for each card (V100, T4, A100, H100 SXM, H200, L4) and its Ada
Lovelace architecture white paper (RTX 4090). These are the denominators of MFU on a GPU and the
inputs of `ampkit plan` on a GPU we do not have.

Memory unit convention: `memory_gib` is the card's nominal capacity read as GiB (1024**3
bytes; GB is 1000**3). HBM/GDDR comes in power-of-two chip sizes, so an "80 GB" card
physically holds 80 GiB; what torch reports as `total_memory` is ~1% less after the driver's
and ECC's reservations (A100-80GB: ~79.3 GiB, H100-80GB: ~79.6 GiB, T4: 15.0 GiB). Plan with
the measured figure when you have the card, with `memory_gib` minus a margin when you do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ampkit.errors import UsageError

if TYPE_CHECKING:
    from ampkit.hardware.device import DeviceInfo

GIB = 1024**3  # GiB is 1024**3 bytes, GB is 1000**3
DTYPE_KEYS = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU model's public dense specs."""

    name: str
    """The table key, e.g. "A100-80GB"."""
    memory_gib: float
    """Nominal memory in GiB (1024**3 bytes); see the module docstring for the convention."""
    bandwidth_gbs: float
    """Peak memory bandwidth in GB/s (1000**3 bytes per second, as vendors state it)."""
    peak_tflops: dict[str, float] = field(default_factory=dict)
    """Dense peak TFLOP/s (1e12 FLOP/s) per compute dtype key; a key is absent when the card has
    no fast path for it (e.g. no "bf16" on V100: it is emulated there)."""
    native_bf16: bool
    """bf16 runs on tensor cores (Ampere and later)."""
    compute_capability: tuple[int, int]
    """CUDA (major, minor)."""

    @property
    def memory_bytes(self) -> int:
        """Nominal memory in bytes."""
        return int(self.memory_gib * GIB)

    def peak_flops(self, dtype_key: str) -> float | None:
        """Dense peak in FLOP/s (not TFLOP/s) for `dtype_key`; None when the card lacks that path."""
        tflops = self.peak_tflops.get(_check_dtype_key(dtype_key))
        return None if tflops is None else tflops * 1e12


def _spec(name, memory_gib, bandwidth_gbs, cc, native_bf16, **tflops) -> GpuSpec:
    return GpuSpec(
        name=name,
        memory_gib=memory_gib,
        bandwidth_gbs=bandwidth_gbs,
        peak_tflops=tflops,
        native_bf16=native_bf16,
        compute_capability=cc,
    )


# Tensor-core figures are dense; RTX 4090's fp16/bf16 figure is with fp32 accumulation.
GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        _spec("V100-16GB", 16, 900, (7, 0), False, fp32=15.7, fp16=125),
        _spec("V100-32GB", 32, 900, (7, 0), False, fp32=15.7, fp16=125),
        _spec("T4", 16, 320, (7, 5), False, fp32=8.1, fp16=65),
        _spec("A100-40GB", 40, 1555, (8, 0), True, fp32=19.5, tf32=156, fp16=312, bf16=312),
        _spec("A100-80GB", 80, 2039, (8, 0), True, fp32=19.5, tf32=156, fp16=312, bf16=312),
        _spec("H100-80GB", 80, 3350, (9, 0), True, fp32=66.9, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9),
        _spec("H200", 141, 4800, (9, 0), True, fp32=66.9, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9),
        _spec("L4", 24, 300, (8, 9), True, fp32=30.3, tf32=60, fp16=121, bf16=121, fp8=242),
        _spec("RTX4090", 24, 1008, (8, 9), True, fp32=82.6, tf32=82.6, fp16=165.2, bf16=165.2, fp8=330),
    )
}

# A bare family name picks the larger-memory variant (the common one in training today).
_ALIASES = {
    "v100": "V100-32GB",
    "a100": "A100-80GB",
    "h100": "H100-80GB",
    "h100sxm": "H100-80GB",
    "h100sxm80gb": "H100-80GB",
    "h200141gb": "H200",
    "l424gb": "L4",
    "4090": "RTX4090",
    "geforcertx4090": "RTX4090",
}


def _normalize(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def lookup_gpu(name: str) -> GpuSpec:
    """The spec for `name`: a table key or alias, any case ("a100", "A100-80GB", "h100"),
    or a CUDA device name ("NVIDIA A100-SXM4-40GB")."""
    wanted = _normalize(name)
    by_key = {_normalize(key): key for key in GPUS}
    key = by_key.get(wanted) or _ALIASES.get(wanted) or match_gpu_model(name)
    if key is None:
        raise UsageError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)} (case-insensitive; 'a100' = A100-80GB)")
    return GPUS[key]


def match_gpu_model(cuda_name: str, *, total_memory_bytes: int | None = None) -> str | None:
    """Map a CUDA device name (e.g. "NVIDIA H100 80GB HBM3") to a `GPUS` key, or None.

    Variants whose peaks differ from the table's (H100 PCIe/NVL, GH200) map to None rather than
    to the SXM figures, so MFU is never computed against the wrong denominator.
    """
    name = cuda_name.upper()
    if "RTX 4090" in name or "RTX4090" in name:
        return "RTX4090"
    if re.search(r"\bT4\b", name):
        return "T4"
    if re.search(r"\bL4\b", name):
        return "L4"
    if "H200" in name and "GH200" not in name:
        return "H200"
    if "H100" in name:
        return None if ("PCIE" in name or "NVL" in name) else "H100-80GB"
    for family, sizes in (("A100", (40, 80)), ("V100", (16, 32))):
        if family in name:
            return f"{family}-{_memory_variant(name, sizes, total_memory_bytes)}GB"
    return None


def _memory_variant(name: str, sizes: tuple[int, int], total_memory_bytes: int | None) -> int:
    """Pick the memory size of a two-variant family from the name, else from the device total."""
    for size in sizes:
        if f"{size}GB" in name.replace(" ", ""):
            return size
    if total_memory_bytes is None:
        return max(sizes)
    # Reported totals sit ~1% under nominal GiB: choose the nearest nominal size.
    return min(sizes, key=lambda size: abs(size * GIB - total_memory_bytes))


def peak_flops(info: DeviceInfo, dtype_key: str) -> float | None:
    """Table peak in FLOP/s for `dtype_key` on `info`'s device; None on CPU, on an unknown GPU, or
    when the GPU has no fast path for that dtype. On CPU use `measured_peak_flops` instead."""
    _check_dtype_key(dtype_key)
    if info.gpu_model is None:
        return None
    return GPUS[info.gpu_model].peak_flops(dtype_key)


def _check_dtype_key(dtype_key: str) -> str:
    if dtype_key not in DTYPE_KEYS:
        raise UsageError(f"unknown compute dtype {dtype_key!r}; use one of: {', '.join(DTYPE_KEYS)}")
    return dtype_key
