"""MFU that means something (`ampkit.bench.peaks`): the denominator is the peak of the compute dtype
really used, an emulated dtype is held to the fp32 peak with a note, and no MFU exceeds 1 -- over
every precision, on synthetic timings."""

from __future__ import annotations

import pytest

from ampkit.bench.peaks import is_native, matmul_ratio, mfu_denominator, mfu_value
from ampkit.bench.summary import precision_entry
from ampkit.precision import SPECS
from bench_fakes import AMX_CPU, AVX2_CPU, peaks_of


def test_denominators_by_dtype_and_device():
    avx2, amx = peaks_of("avx2"), peaks_of("amx")
    emulated = mfu_denominator("bf16-mixed", AVX2_CPU, avx2)
    assert emulated["dtype"] == "fp32" and emulated["peak_flops"] == 1.0e11 and "emulated" in emulated["note"]
    native = mfu_denominator("bf16-mixed", AMX_CPU, amx)
    assert native["dtype"] == "bf16" and native["peak_flops"] == 1.26e12 and native["note"] is None
    assert mfu_denominator("fp32", AVX2_CPU, avx2)["dtype"] == "fp32"
    assert not is_native("fp8-emulated", AMX_CPU) and is_native("fp16-mixed", AMX_CPU)
    assert matmul_ratio("bf16-mixed", avx2) == pytest.approx(0.05) and matmul_ratio("fp32", avx2) == 1.0


def test_an_mfu_above_one_is_not_reported():
    value, note = mfu_value(2000.0, 1e8, {"peak_flops": 1e11, "source": "measured-matmul", "dtype": "bf16"})
    assert value is None and note.startswith("not reported: 200 GFLOP/s achieved exceeds the bf16 peak of 100")
    assert mfu_value(500.0, 1e8, {"peak_flops": 1e11, "dtype": "fp32", "note": None}) == (0.5, None)


def _result(name: str, step_s: float) -> dict:
    return {
        "precision": name,
        "status": "ok",
        "error": None,
        "files": {"result": "r", "log": "l", "fidelity": None},
        "warmup_steps": 2,
        "measured_steps": 5,
        "step_s": [step_s] * 5,
        "tokens": [4096] * 5,
        "slots": [4096] * 5,
        "loss_curve": [5.0] * 7,
        "skipped_steps": 0,
        "nonfinite_loss_steps": 0,
        "nonfinite_grad_steps": 0,
        "final_loss_scale": None,
        "memory": {"kind": "cpu-rss", "peak_bytes": 1, "run_bytes": 1},
    }


@pytest.mark.parametrize("cpu, kind", [(AVX2_CPU, "avx2"), (AMX_CPU, "amx")])
@pytest.mark.parametrize("step_s", [1e-4, 1e-2, 1.0])
def test_no_mfu_above_one_over_every_precision(cpu, kind, step_s):
    """134.9% was bf16-mixed against an emulated-bf16 matmul probe; now no denominator allows > 100%."""
    peaks = peaks_of(kind)
    for name in SPECS:
        entry = precision_entry(_result(name, step_s), info=cpu, peaks=peaks, flops_per_item=5e6)
        mfu = entry["mfu"]
        assert mfu["value"] is None or 0 <= mfu["value"] <= 1.0, (name, mfu)
        if mfu["value"] is None and mfu["peak_flops"]:
            assert mfu["note"].startswith("not reported")
