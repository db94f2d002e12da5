"""Measured matmul throughput per dtype: the MFU denominator on a CPU, a sanity check on a GPU.

Timing hazards handled here: accelerator kernels run asynchronously (we synchronize before reading
the clock, through `backend.py`), the first calls pay for allocation and kernel selection (warm-up), and a busy host
slows some repeats down (we keep the fastest repeat, see `measure_matmul_flops`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ampkit.errors import UsageError
from ampkit.formats import dtype_of, short_name
from ampkit.hardware.backend import backend_for, with_index
from ampkit.hardware.capabilities import absence_note
from ampkit.hardware.device import BF16_CPU_FLAGS, FP16_CPU_FLAGS, DeviceInfo, describe_device, pick_device
from ampkit.hardware.gpus import peak_flops

# Compute dtype keys measured by `survey_matmul`, and the tensor dtype each one multiplies in.
# "tf32" is fp32 tensors with TF32 tensor cores allowed (CUDA Ampere+ only).
MATMUL_KEYS = ("fp32", "tf32", "bf16", "fp16")
MATMUL_DTYPES: dict[str, torch.dtype] = {key: dtype_of(key) for key in MATMUL_KEYS}  # tf32: fp32 tensors

# Square matmul sizes n for (n x n) @ (n x n). Emulated dtypes on a CPU run at ~1 GFLOP/s
# (a 1024^2 bf16 matmul takes ~2.4 s on an AVX2-only EPYC), so they get a smaller n.
CUDA_SIZE, CUDA_QUICK_SIZE = 8192, 1024  # large enough that launch overhead is negligible
CPU_SIZE, CPU_QUICK_SIZE = 1024, 256
CPU_EMULATED_SIZE, CPU_EMULATED_QUICK_SIZE = 256, 64


def matmul_flops(size: int) -> int:
    """FLOPs of one (n x n) @ (n x n) matmul: n^2 outputs, each n multiplies and n adds."""
    return 2 * size**3


@contextmanager
def _fp32_matmul_precision(*, allow_tf32: bool) -> Iterator[None]:
    """Pin fp32 matmul precision ("highest" = IEEE fp32) for the block and restore it after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _time_matmuls(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, count: int) -> float:
    """Seconds for `count` back-to-back matmuls, from launch to completion."""
    synchronize = backend_for(a.device).synchronize  # a no-op on CPU; a CPU-device sync point elsewhere
    synchronize()
    start = time.perf_counter()
    for _ in range(count):
        torch.matmul(a, b, out=out)
    synchronize()
    return time.perf_counter() - start


def measure_matmul_flops(
    dtype: torch.dtype,
    *,
    device: str | torch.device,
    size: int = 1024,
    min_time_s: float = 0.2,
    warmup: int = 2,
    allow_tf32: bool = False,
) -> float:
    """Measured FLOP/s of an (n x n) @ (n x n) matmul in `dtype` on `device` (n = `size`).

    After `warmup` untimed calls, repeats are timed until `min_time_s` seconds have elapsed
    (at least one). Each repeat batches enough matmuls to take ~1/10 of `min_time_s`, so clock
    and launch overheads stay small. We keep the *best* repeat, not the median: this is a
    peak (the MFU denominator); interference from other processes only ever slows a repeat
    down, so the fastest one is the least-contaminated and most reproducible estimate.
    `allow_tf32` lets fp32 matmuls use TF32 tensor cores (CUDA, and ROCm's XF32 on MI300).
    """
    dev = torch.device(device)
    _check_measure_args(dev, size=size, min_time_s=min_time_s, warmup=warmup, allow_tf32=allow_tf32)
    # randn in fp32 then cast: N(0, 1) inputs keep every dtype finite (no inf/NaN slow paths)
    a = torch.randn(size, size, device=dev).to(dtype)
    b = torch.randn(size, size, device=dev).to(dtype)
    out = torch.empty(size, size, device=dev, dtype=dtype)  # reused: no allocator noise in the timing
    with torch.no_grad(), _fp32_matmul_precision(allow_tf32=allow_tf32):
        for _ in range(warmup):
            torch.matmul(a, b, out=out)
        first_s = _time_matmuls(a, b, out, count=1)
        count = max(1, int(min_time_s / 10 / max(first_s, 1e-9)))
        best_s, elapsed_s = first_s, first_s
        while elapsed_s < min_time_s:
            repeat_s = _time_matmuls(a, b, out, count=count)
            best_s = min(best_s, repeat_s / count)
            elapsed_s += repeat_s
    return matmul_flops(size) / max(best_s, 1e-12)


def _check_measure_args(dev: torch.device, *, size: int, min_time_s: float, warmup: int, allow_tf32: bool) -> None:
    if size < 1:
        raise UsageError(f"matmul size must be >= 1, got {size}")
    if not (min_time_s > 0 and math.isfinite(min_time_s)):
        raise UsageError(f"min_time_s must be a positive number of seconds, got {min_time_s}")
    if warmup < 0:
        raise UsageError(f"warmup must be >= 0, got {warmup}")
    if allow_tf32 and dev.type != "cuda":
        raise UsageError(
            "TF32 exists only on CUDA (Ampere or later) and ROCm (MI300); measure fp32 on this device instead"
        )


def matmul_size_for(info: DeviceInfo, dtype_key: str, *, quick: bool = False) -> int:
    """The matmul size n used to measure `dtype_key` on `info`'s device (smaller when emulated)."""
    if info.type != "cpu":  # an accelerator: large enough that launch overhead is negligible
        return CUDA_QUICK_SIZE if quick else CUDA_SIZE
    if info.is_native(dtype_key):
        return CPU_QUICK_SIZE if quick else CPU_SIZE
    return CPU_EMULATED_QUICK_SIZE if quick else CPU_EMULATED_SIZE


def measured_peak_flops(device: str | torch.device, dtype: torch.dtype = torch.float32) -> float:
    """Measured matmul FLOP/s on `device` in `dtype` (IEEE fp32 by default), once per process.

    The MFU denominator on a CPU (no table peak there); covers all of torch's CPU threads.
    """
    return _measured_peak_flops(with_index(pick_device(str(device))), dtype)


@functools.cache
def _measured_peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    info = describe_device(device)
    key = short_name(dtype) if short_name(dtype) in MATMUL_KEYS else None
    if key is None:
        raise UsageError(f"no matmul peak for {dtype}; use torch.float32, torch.bfloat16 or torch.float16")
    return measure_matmul_flops(dtype, device=device, size=matmul_size_for(info, key))


@dataclass(frozen=True, kw_only=True)
class MatmulThroughput:
    """One dtype's measured matmul throughput on one device."""

    dtype_key: str
    """"fp32", "tf32", "bf16" or "fp16"."""
    native: bool
    """The device runs this dtype in hardware (else emulated, or for tf32: unsupported)."""
    size: int | None
    """Matmul size n used for the measurement; None when not measured."""
    measured_flops: float | None
    """Measured FLOP/s (not TFLOP/s); None when not measured (tf32 without TF32 cores)."""
    ratio_vs_fp32: float | None
    """measured_flops / fp32's measured_flops; None when not measured."""
    table_peak_flops: float | None
    """The GPU table's dense peak in FLOP/s for this dtype; None on CPU or an unknown GPU."""


def survey_matmul(info: DeviceInfo, device: torch.device, *, quick: bool = False) -> list[MatmulThroughput]:
    """Measure fp32 (then tf32 on an accelerator), bf16 and fp16 matmuls on `device`; fp32 first, the baseline."""
    keys = ["fp32", "bf16", "fp16"] if info.type == "cpu" else ["fp32", "tf32", "bf16", "fp16"]
    min_time_s = 0.05 if quick else 0.5  # long enough for a clean repeat on a busy host
    results: list[MatmulThroughput] = []
    fp32_flops: float | None = None
    for key in keys:
        measurable = key != "tf32" or info.has_tf32
        size = matmul_size_for(info, key, quick=quick) if measurable else None
        flops = None
        if size is not None:
            flops = measure_matmul_flops(
                MATMUL_DTYPES[key],
                device=device,
                size=size,
                min_time_s=min_time_s,
                warmup=1 if quick else 2,
                allow_tf32=(key == "tf32"),
            )
        fp32_flops = flops if key == "fp32" else fp32_flops
        ratio = flops / fp32_flops if (flops is not None and fp32_flops) else None
        results.append(
            MatmulThroughput(
                dtype_key=key,
                native=info.is_native(key),
                size=size,
                measured_flops=flops,
                ratio_vs_fp32=ratio,
                table_peak_flops=peak_flops(info, key),
            )
        )
    return results


def throughput_note(info: DeviceInfo, entry: MatmulThroughput) -> str:
    """One line on what `entry` means for precision choice, e.g.
    "0.0072x fp32 — emulated: this CPU has no avx512_bf16/amx_bf16; use fp32 here"."""
    verdict = throughput_verdict(info, entry)
    if entry.ratio_vs_fp32 is None or entry.dtype_key == "fp32":
        return verdict
    return f"{format_ratio(entry.ratio_vs_fp32)}x fp32 — {verdict}"


def throughput_verdict(info: DeviceInfo, entry: MatmulThroughput) -> str:
    """`throughput_note` without the leading ratio: native/emulated and what to use here."""
    if entry.dtype_key == "fp32":
        return "the reference"
    if entry.measured_flops is None or entry.ratio_vs_fp32 is None:
        return f"unsupported: {info.where} has no TF32 units{_note(info, 'tf32')}; use fp32 or fp16-mixed"
    if not entry.native:
        return f"emulated: {_emulation_reason(info, entry.dtype_key)}"
    if entry.ratio_vs_fp32 >= 1.1:
        return "native, faster than fp32"
    if entry.ratio_vs_fp32 >= 0.9:
        return "native, but no faster than fp32 for matmuls here"
    return "native, yet slower than fp32 here; prefer fp32"


def _emulation_reason(info: DeviceInfo, dtype_key: str) -> str:
    if info.type == "cpu":
        flags = BF16_CPU_FLAGS[:2] if dtype_key == "bf16" else FP16_CPU_FLAGS[:2]  # the x86 names
        return f"this CPU has no {'/'.join(flags)}; use fp32 here"
    if dtype_key == "bf16":
        return f"no native bf16 on {info.where}{_note(info, 'bf16')}; use fp16-mixed here"
    return "no fp16 tensor cores (compute capability < 7.0); use fp32 here"


def _note(info: DeviceInfo, dtype_key: str) -> str:
    note = absence_note(info.kind, dtype_key)
    return f" ({note})" if note else ""


def format_ratio(ratio: float) -> str:
    """A speed ratio with enough digits to read small ones: 7.54, 0.0072."""
    return f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}"
