"""The device's peak FLOP/s per compute dtype, measured once in the parent before any worker starts,
and the MFU denominator each precision is held to.

Peaks: on a GPU of `ampkit.hardware.gpus`' table, the data sheet's dense tensor-core figure; elsewhere
(a CPU, an unknown GPU) a matmul measured here in that dtype (`ampkit.hardware.matmul`, the same probe
as `ampkit hw`). The measured ratios also feed the budget's estimates (`bench.budget`): an emulated
bf16 matmul 20x slower than fp32's predicts a step many times fp32's. They are a large GEMM's: a small
model's matmuls can be far less (or more) affected, so the summary's Amdahl prediction takes its matmul
ratio from the profiled steps instead (`bench.ratios.profile_ratios`).

MFU denominators (`mfu_denominator`): the peak of the compute dtype really used -- fp32's for fp32
(IEEE: TF32 off), the tensor-core peak of tf32/bf16/fp16/fp8 where the device runs them natively. A
dtype emulated here (bf16 on an AVX2-only CPU) runs on fp32 units, so its MFU is against the fp32
peak, with a note. An MFU above 1 would mean the probe under-measured the peak: it is not reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ampkit.bench.candidates import candidate_spec
from ampkit.hardware import matmul_size_for, measure_matmul_flops, measured_peak_flops, peak_flops
from ampkit.hardware.backend import backend_for
from ampkit.hardware.matmul import MATMUL_DTYPES

if TYPE_CHECKING:
    from ampkit.hardware import DeviceInfo


def measure_peaks(info: DeviceInfo, precisions: list[str], device: torch.device) -> dict[str, dict[str, Any]]:
    """{dtype key: {"peak_flops", "source", "dtype"}} for fp32 and every compute dtype of `precisions`."""
    keys = dict.fromkeys(["fp32"] + [candidate_spec(name).matmul_key for name in precisions])
    peaks = {key: _peak(key, info, device) for key in keys}
    backend_for(device).empty_cache()  # the probe's buffers go back to the device before any worker starts
    return peaks


def _peak(key: str, info: DeviceInfo, device: torch.device) -> dict[str, Any]:
    if info.gpu_model is not None:  # a card of the GPU table (NVIDIA, AMD)
        table = peak_flops(info, key)
        if table:
            return {"peak_flops": table, "source": "gpu-table", "dtype": key}
    if key == "fp8" or key not in MATMUL_DTYPES:  # no fp8 matmul probe: an unknown fp8 GPU gets no MFU
        return {"peak_flops": None, "source": "unknown", "dtype": key}
    if key == "tf32":
        size = matmul_size_for(info, "tf32")
        measured = measure_matmul_flops(torch.float32, device=device, size=size, allow_tf32=True)
    else:
        measured = measured_peak_flops(device, MATMUL_DTYPES[key])
    return {"peak_flops": measured, "source": "measured-matmul", "dtype": key}


def is_native(precision: str, info: DeviceInfo) -> bool:
    """The precision's compute dtype runs in hardware here (fp8-emulated never does)."""
    spec = candidate_spec(precision)
    return not spec.emulated and (spec.matmul_key == "fp32" or info.is_native(spec.matmul_key))


def matmul_ratio(precision: str, peaks: dict[str, dict[str, Any]]) -> float | None:
    """The precision's compute-dtype peak over fp32's (0.05: 20x slower; None: not measured)."""
    mine = (peaks.get(candidate_spec(precision).matmul_key) or {}).get("peak_flops")
    fp32 = (peaks.get("fp32") or {}).get("peak_flops")
    return mine / fp32 if mine and fp32 else None


def mfu_denominator(precision: str, info: DeviceInfo, peaks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{"peak_flops", "source", "dtype", "note"}: the peak this precision's MFU is held to."""
    spec = candidate_spec(precision)
    if is_native(precision, info):
        found = dict(peaks.get(spec.matmul_key) or {"peak_flops": None, "source": "unknown", "dtype": spec.matmul_key})
        return {**found, "note": None}
    fp32 = dict(peaks.get("fp32") or {"peak_flops": None, "source": "unknown", "dtype": "fp32"})
    note = f"{spec.matmul_key} is emulated here (it runs on fp32 units): MFU against the fp32 peak"
    return {**fp32, "note": note}


def mfu_value(
    items_per_s: float, flops_per_item: float | None, denominator: dict[str, Any]
) -> tuple[float | None, str | None]:
    """(MFU as a fraction, note): None with a note when it would exceed 1 (an under-measured peak)."""
    peak = denominator.get("peak_flops")
    if not peak or not flops_per_item:
        return None, denominator.get("note")
    value = items_per_s * flops_per_item / peak
    if value <= 1.0:
        return value, denominator.get("note")
    achieved = items_per_s * flops_per_item
    return None, (
        f"not reported: {achieved / 1e9:,.0f} GFLOP/s achieved exceeds the {denominator['dtype']} peak of "
        f"{peak / 1e9:,.0f} GFLOP/s ({denominator['source']}), which therefore under-measures this device"
    )
