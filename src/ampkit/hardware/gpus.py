"""Public dense (no sparsity) specs of the GPUs people train on, own or rent: the peak FLOP/s table.

Each row states its source (`GpuSpec.source`, printed by `ampkit plan --gpu list`): the vendor's
data sheet or architecture white paper for that card. Where a sheet quotes peaks "with sparsity"
only, the dense figure is half of it, and the row says so. These are the denominators of MFU on a
GPU and the inputs of `ampkit plan` on a GPU we do not have.

Memory unit convention: `memory_gib` is the card's nominal capacity read as GiB (1024**3
bytes; GB is 1000**3). HBM/GDDR comes in power-of-two chip sizes, so an "80 GB" card
physically holds 80 GiB; what torch reports as `total_memory` is ~1% less after the driver's
and ECC's reservations (A100-80GB: ~79.3 GiB, H100-80GB: ~79.6 GiB, T4: 15.0 GiB). Plan with
the measured figure when you have the card, with `memory_gib` minus a margin when you do not.
Bandwidth is GB/s (1000**3 bytes per second), as vendors state it.

One row is one device as torch sees it: an MI250X module is two GCDs, which torch shows as two
devices, so its row is one GCD (half the module's memory, bandwidth and peaks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from ampkit.errors import UsageError
from ampkit.hardware.capabilities import DeviceFacts, capabilities


class KnownCard(Protocol):
    """What `peak_flops` reads of a device (`DeviceInfo`, which imports this module, has it)."""

    @property
    def gpu_model(self) -> str | None:
        """the `GPUS` key of the card, or None (CPU, XPU, MPS, an unknown GPU)"""
        ...


GIB = 1024**3  # GiB is 1024**3 bytes, GB is 1000**3
PEAK_KEYS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
"""The table's peak columns, as data sheets print them; fp4 is Blackwell's block-scaled 4-bit MMA (the
rate of MXFP4 and NVFP4 alike)."""
BLOCK_SCALED_AT = {"mxfp8": "fp8"}
"""Keys without a column of their own: MXFP8 runs at the card's fp8 rate where it has block-scaled MMA
(NVIDIA's B200 and GB200 sheets quote one "FP8/FP6 Tensor Core" figure, which the Blackwell technical
brief gives for the MX formats too), and nowhere else (Hopper and Ada multiply fp8, not MX blocks)."""
DTYPE_KEYS = (*PEAK_KEYS[:5], *BLOCK_SCALED_AT, "fp4")
"""The compute dtype keys precisions run at (`PrecisionSpec.matmul_key`, `DeviceInfo.is_native`), the
peak of each a column of the table or, for "mxfp8", derived (`BLOCK_SCALED_AT`)."""


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU model's public dense specs."""

    name: str
    """The table key, e.g. "A100-80GB"."""
    vendor: str
    """"NVIDIA" or "AMD"."""
    memory_gib: float
    """Nominal memory in GiB (1024**3 bytes); see the module docstring for the convention."""
    bandwidth_gbs: float
    """Peak memory bandwidth in GB/s (1000**3 bytes per second, as vendors state it)."""
    peak_tflops: dict[str, float] = field(default_factory=dict)
    """Dense peak TFLOP/s (1e12 FLOP/s) per `PEAK_KEYS` key; a key is absent when the card has no
    fast path for it (e.g. no "bf16" on V100: it is emulated there)."""
    native_bf16: bool
    """bf16 runs on matrix units (NVIDIA Ampere and later, AMD MI200 and later)."""
    block_scaled: bool = False
    """block-scaled MMA (MXFP8, MXFP4, NVFP4) that ampkit's MX/NVFP4 training drives (NVIDIA sm100)."""
    compute_capability: tuple[int, int] | None
    """NVIDIA: CUDA (major, minor). None for AMD (see `arch`)."""
    arch: str
    """"sm_80" (NVIDIA) or the gfx architecture, e.g. "gfx942" (AMD)."""
    source: str
    """Where the figures come from (data sheet, white paper) and how dense peaks were derived."""

    @property
    def memory_bytes(self) -> int:
        """Nominal memory in bytes."""
        return int(self.memory_gib * GIB)

    def peak_flops(self, dtype_key: str) -> float | None:
        """Dense peak in FLOP/s (not TFLOP/s) for `dtype_key`; None when the card lacks that path."""
        key = _check_peak_key(dtype_key)
        if key in BLOCK_SCALED_AT:
            if not self.block_scaled:
                return None
            key = BLOCK_SCALED_AT[key]
        tflops = self.peak_tflops.get(key)
        return None if tflops is None else tflops * 1e12


def _row(
    name: str,
    vendor: str,
    memory_gib: float,
    bandwidth_gbs: float,
    facts: DeviceFacts,
    arch: str,
    *,
    source: str,
    tflops: dict[str, float],
) -> GpuSpec:
    """One table row; bf16 on matrix units decided by the rules a live device of that kind gets."""
    return GpuSpec(
        name=name,
        vendor=vendor,
        memory_gib=memory_gib,
        bandwidth_gbs=bandwidth_gbs,
        peak_tflops=tflops,
        native_bf16=capabilities(facts).native_bf16,
        block_scaled=capabilities(facts).has_mx,
        compute_capability=facts.compute_capability,
        arch=arch,
        source=source,
    )


def _nvidia(
    name: str, memory_gib: float, bandwidth_gbs: float, cc: tuple[int, int], *, source: str, **tflops: float
) -> GpuSpec:
    facts = DeviceFacts(kind="cuda", compute_capability=cc)
    return _row(name, "NVIDIA", memory_gib, bandwidth_gbs, facts, f"sm_{cc[0]}{cc[1]}", source=source, tflops=tflops)


def _amd(name: str, memory_gib: float, bandwidth_gbs: float, arch: str, *, source: str, **tflops: float) -> GpuSpec:
    facts = DeviceFacts(kind="rocm", arch=arch)  # no compute capability: the table row names the gfx arch
    return _row(name, "AMD", memory_gib, bandwidth_gbs, facts, arch, source=source, tflops=tflops)


# Columns: name, memory (nominal GiB), bandwidth (GB/s), CUDA cc or gfx arch; dense TFLOP/s per dtype.
# Tensor-core fp16/bf16 figures are with fp32 accumulation (what autocast training uses): on GeForce
# cards that is half the fp16-accumulate figure the marketing quotes.
# fmt: off
GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        # Volta: fp16 tensor cores only (bf16 emulated); the SXM2 figures
        _nvidia("V100-16GB", 16, 900, (7, 0), fp32=15.7, fp16=125, source="NVIDIA Tesla V100 data sheet (SXM2)"),
        _nvidia("V100-32GB", 32, 900, (7, 0), fp32=15.7, fp16=125, source="NVIDIA Tesla V100 data sheet (SXM2)"),
        # Turing: fp16 tensor cores, mixed precision
        _nvidia("T4", 16, 320, (7, 5), fp32=8.1, fp16=65, source="NVIDIA T4 data sheet"),
        # AWS g5's A10 variant (lower tensor clocks than the A10); NVIDIA publishes no sheet for it
        _nvidia("A10G", 24, 600, (8, 6), fp32=31.5, tf32=35, fp16=70, bf16=70,
                source="AWS EC2 G5 instance specs and Baseten's A10 vs A10G spec table (no NVIDIA data sheet)"),
        # Ampere: the sheet's first (dense) column; the starred one is with sparsity
        _nvidia("A100-40GB", 40, 1555, (8, 0), fp32=19.5, tf32=156, fp16=312, bf16=312,
                source="NVIDIA A100 data sheet (SXM4 40GB), dense column"),
        _nvidia("A100-80GB", 80, 2039, (8, 0), fp32=19.5, tf32=156, fp16=312, bf16=312,
                source="NVIDIA A100 data sheet (SXM4 80GB), dense column"),
        # GA102 with fp32 accumulation at full rate on the professional card, half rate on GeForce
        _nvidia("RTX3090", 24, 936, (8, 6), fp32=35.6, tf32=35.6, fp16=71, bf16=71,
                source="NVIDIA Ampere GA102 white paper (GeForce RTX 3090), dense, fp32 accumulate"),
        _nvidia("RTX-A6000", 48, 768, (8, 6), fp32=38.7, tf32=77.4, fp16=154.8, bf16=154.8,
                source="NVIDIA RTX A6000 data sheet and GA102 white paper, dense = sparse/2"),
        # Hopper: dense = the sheet's sparse figures halved
        _nvidia("H100-80GB", 80, 3350, (9, 0), fp32=66.9, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9,
                source="NVIDIA H100 data sheet (SXM5) and Hopper white paper, dense = sparse/2"),
        _nvidia("H200", 141, 4800, (9, 0), fp32=66.9, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9,
                source="NVIDIA H200 data sheet (SXM): H100 SXM compute, 141 GB HBM3e; dense = sparse/2"),
        # Ada: fp8 tensor cores
        _nvidia("L4", 24, 300, (8, 9), fp32=30.3, tf32=60, fp16=121, bf16=121, fp8=242,
                source="NVIDIA L4 data sheet, dense = sparse/2"),
        _nvidia("L40S", 48, 864, (8, 9), fp32=91.6, tf32=183, fp16=362, bf16=362, fp8=733,
                source="NVIDIA L40S data sheet, dense = sparse/2"),
        _nvidia("RTX4090", 24, 1008, (8, 9), fp32=82.6, tf32=82.6, fp16=165.2, bf16=165.2, fp8=330,
                source="NVIDIA Ada Lovelace white paper (GeForce RTX 4090), dense, fp32 accumulate"),
        # Blackwell: per GPU = the 8-GPU board's figures / 8 (180 GB of HBM3e each); fp4 tensor cores
        # (the block-scaled MMA of MXFP4 and NVFP4; MXFP8 at the fp8 figure: `BLOCK_SCALED_AT`)
        _nvidia("B200", 180, 8000, (10, 0), fp32=75, tf32=1100, fp16=2250, bf16=2250, fp8=4500, fp4=9000,
                source="NVIDIA HGX B200 data sheet, per GPU (board / 8), dense = sparse/2"),
        # GB200: the same die at up to 1,200 W beside a Grace CPU; the NVL72 sheet's per-GPU column
        # (FP4 20 PF, FP8/FP6 10 PF, FP16/BF16 5 PF, TF32 2.5 PF sparse; FP32 80 TF; 186 GB, 8 TB/s)
        _nvidia("GB200", 186, 8000, (10, 0), fp32=80, tf32=1250, fp16=2500, bf16=2500, fp8=5000, fp4=10000,
                source="NVIDIA GB200 NVL72 data sheet, individual Blackwell GPU column, dense = sparse/2"),
        # CDNA2: one of the module's two GCDs (torch sees each as a device); fp32 is the matrix rate
        _amd("MI250X", 64, 1638.4, "gfx90a", fp32=47.9, fp16=191.5, bf16=191.5,
             source="AMD Instinct MI250X data sheet, per GCD (half the module's 128 GB, 3.2 TB/s, 383 TFLOP/s)"),
        # CDNA3: XF32 ("TF32") and fnuz float8 matrix cores; AMD quotes dense figures first
        _amd("MI300X", 192, 5300, "gfx942", fp32=163.4, tf32=653.7, fp16=1307.4, bf16=1307.4, fp8=2614.9,
             source="AMD Instinct MI300X data sheet, dense (sparsity figures are 2x)"),
    )
}
# fmt: on

_ALIASES = {
    "h100sxm": "H100-80GB",
    "h100sxm80gb": "H100-80GB",
    "h200141gb": "H200",
    "l424gb": "L4",
    "l40s48gb": "L40S",
    "4090": "RTX4090",
    "geforcertx4090": "RTX4090",
    "3090": "RTX3090",
    "geforcertx3090": "RTX3090",
    "a6000": "RTX-A6000",
    "mi300xoam": "MI300X",
}
"""Other spellings of one row. A family with several rows (A100, V100) has no alias: it is refused,
listing its variants, rather than silently meaning one of them."""


def _normalize(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def _family(normalized: str) -> str:
    """ "a10080gb" -> "a100": a row's name without its memory size."""
    return re.sub(r"\d+gb$", "", normalized)


def lookup_gpu(name: str, *, unknown_hint: str = "") -> GpuSpec:
    """The spec for `name`: a table key or alias, any case ("A100-80GB", "h100", "mi300x"), or a
    device name ("NVIDIA A100-SXM4-40GB"). A name that fits several rows ("A100": 40GB and 80GB) is
    refused, listing them; `unknown_hint` ends the message for a name that fits none."""
    wanted = _normalize(name)
    by_key = {_normalize(key): key for key in GPUS}
    key = by_key.get(wanted) or _ALIASES.get(wanted)
    candidates = [key] if key else [k for k in GPUS if _family(_normalize(k)) == wanted]
    candidates = candidates or match_gpu_candidates(name)
    if len(candidates) > 1:
        raise UsageError(f"GPU {name!r} matches several variants: {', '.join(candidates)}; name one of them")
    if not candidates:
        raise UsageError(
            f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)} (case-insensitive"
            + (f"; {unknown_hint})" if unknown_hint else ")")
        )
    return GPUS[candidates[0]]


def match_gpu_model(device_name: str, *, total_memory_bytes: int | None = None) -> str | None:
    """Map a device name (e.g. "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X") to a `GPUS` key, or None.

    Variants whose peaks differ from the table's (H100 PCIe/NVL, GH200, RTX 3090 Ti, MI300A,
    MI325X; "MI250X/MI250", the name ROCm gives both cards) map to None rather than to a neighbour's
    figures, so MFU is never computed against the wrong denominator; so does a two-variant family
    (A100, V100) whose size neither the name nor `total_memory_bytes` tells.
    """
    found = match_gpu_candidates(device_name, total_memory_bytes=total_memory_bytes)
    return found[0] if len(found) == 1 else None


_SINGLE_ROWS = (  # (pattern on the upper-cased device name, excluded variant pattern or None, key)
    (r"RTX ?4090", None, "RTX4090"),
    (r"RTX ?3090", r"3090 ?TI", "RTX3090"),
    (r"RTX ?A6000", None, "RTX-A6000"),
    (r"\bT4\b", None, "T4"),
    (r"\bL4\b", None, "L4"),
    (r"\bL40S\b", None, "L40S"),
    (r"\bA10G\b", None, "A10G"),
    (r"GB200", None, "GB200"),
    (r"\bB200\b", None, "B200"),
    (r"H200", r"GH200", "H200"),
    (r"H100", r"PCIE|NVL", "H100-80GB"),
    (r"MI300X", None, "MI300X"),
    (r"MI250X", r"MI250X/MI250", "MI250X"),
)


def match_gpu_candidates(device_name: str, *, total_memory_bytes: int | None = None) -> list[str]:
    """Every `GPUS` key a device name can mean: one, several (a family whose size is not told), or none."""
    name = device_name.upper()
    for pattern, excluded, key in _SINGLE_ROWS:
        if re.search(pattern, name):
            return [] if excluded and re.search(excluded, name) else [key]
    for family, sizes in (("A100", (40, 80)), ("V100", (16, 32))):
        if family in name:
            return [f"{family}-{size}GB" for size in _memory_variants(name, sizes, total_memory_bytes)]
    return []


def _memory_variants(name: str, sizes: tuple[int, int], total_memory_bytes: int | None) -> tuple[int, ...]:
    """The memory sizes of a two-variant family the name, else the device total, allows."""
    for size in sizes:
        if f"{size}GB" in name.replace(" ", ""):
            return (size,)
    if total_memory_bytes is None:
        return sizes
    # Reported totals sit ~1% under nominal GiB: choose the nearest nominal size.
    return (min(sizes, key=lambda size: abs(size * GIB - total_memory_bytes)),)


def peak_flops(info: KnownCard, dtype_key: str) -> float | None:
    """Table peak in FLOP/s for `dtype_key` on `info`'s device; None on CPU, XPU, MPS, on an unknown
    GPU, or when the GPU has no fast path for that dtype. On CPU use `measured_peak_flops` instead."""
    _check_peak_key(dtype_key)
    if info.gpu_model is None:
        return None
    return GPUS[info.gpu_model].peak_flops(dtype_key)


def _check_peak_key(dtype_key: str) -> str:
    if dtype_key not in DTYPE_KEYS:
        raise UsageError(f"unknown compute dtype {dtype_key!r}; use one of: {', '.join(DTYPE_KEYS)}")
    return dtype_key
