"""ampkit.bench.render: the side-by-side rows, fidelity and memory tables, from a bench summary."""

from __future__ import annotations

from ampkit.bench.render import fidelity_rows, main_rows, memory_rows, recommendation_text

MIB = 1024**2


def _ok(name: str, *, items_per_s: float, peak_mib: int, speedup: float | None, cosine: float | None) -> dict:
    return {
        "name": name,
        "status": "ok",
        "native": name != "bf16-mixed",
        "native_note": "emulated: no avx512_bf16/amx_bf16" if name == "bf16-mixed" else "native",
        "steps": {"measured": 10, "warmup": 2, "stalled": 1 if name == "fp32" else 0},
        "timing": {"items_per_s": items_per_s, "step_ms_median": 120.0, "step_ms_p10": 110.0, "step_ms_p90": 150.0},
        "mfu": {"value": 0.25, "peak_dtype": "fp32", "peak_source": "measured", "peak_flops": 1e11},
        "memory": {"peak_bytes": peak_mib * MIB, "run_bytes": peak_mib * MIB // 2},
        "loss": {"final": 2.5},
        "stability": {
            "stable": True,
            "reason": None,
            "skipped_steps": 0,
            "nonfinite_grad_steps": 0,
            "final_loss_scale": None,
        },
        "vs_fp32": None if speedup is None else {"speedup": speedup, "memory_ratio": peak_mib / 1000},
        "fidelity": None
        if cosine is None
        else {
            "logits_cosine": cosine,
            "logits_max_abs_diff": 0.01,
            "loss_diff": 1e-4,
            "grad_cosine": 0.999,
            "loss_curve": {"max_gap": None, "mean_gap": None, "steps_compared": 0},
            "verdict": "good",
            "passed": True,
        },
    }


def _summary() -> dict:
    failed = {"name": "fp16-mixed", "status": "failed", "error": "out of memory", "steps": None, "timing": None}
    failed.update({"mfu": None, "memory": None, "loss": None, "stability": None, "vs_fp32": None, "fidelity": None})
    return {
        "reference": "fp32",
        "device": {"type": "cpu"},
        "recommendation": {"precision": "fp32", "reason": "fp32: nothing measured here beats it by more than 5%"},
        "precisions": [
            _ok("fp32", items_per_s=1000.0, peak_mib=1000, speedup=1.0, cosine=1.0),
            _ok("bf16-mixed", items_per_s=50.0, peak_mib=800, speedup=0.05, cosine=0.999987),
            failed,
        ],
    }


def test_main_rows_one_per_precision_with_status_words():
    headers, rows = main_rows(_summary())
    assert len(headers) == len(rows[0]) == 12
    fp32, bf16, fp16 = (dict(zip(headers, row)) for row in rows)
    assert fp32["steps measured"] == "10 (+2 warmup), 1 stalled" and fp32["tokens/s"] == "1,000"
    assert fp32["status"] == "RECOMMENDED" and fp32["step ms median (p10-p90)"] == "120 (110-150)"
    assert bf16["vs fp32"] == "0.05x" and bf16["memory vs fp32"] == "0.80x" and bf16["logits cos"] == "0.999987"
    assert bf16["status"] == "good; emulated: no avx512_bf16/amx_bf16" and bf16["MFU"] == "25.0% of fp32"
    assert fp16["status"] == "failed: out of memory" and fp16["tokens/s"] == "-"


def test_fidelity_and_memory_tables_skip_failed_precisions():
    _, fidelity = fidelity_rows(_summary())
    assert [r[0] for r in fidelity] == ["fp32", "bf16-mixed"]
    assert fidelity[0][-1] == "reference" and fidelity[1][-1] == "good" and fidelity[1][5] == "-"
    headers, memory = memory_rows(_summary())
    assert headers[1:3] == ["peak RSS", "run (growth)"]
    assert memory[1] == ["bf16-mixed", "800 MiB", "400 MiB", "0.80x"]


def test_recommendation_text():
    assert recommendation_text(_summary()).startswith("Recommendation: fp32: nothing measured")
    none = {"recommendation": {"precision": None, "reason": "no recommendation: the fp32 reference failed"}}
    assert recommendation_text(none) == "No recommendation: the fp32 reference failed"
