"""ampkit.bench.render: the side-by-side rows, fidelity and memory tables, from a bench summary."""

from __future__ import annotations

from ampkit.bench.render import (
    fidelity_rows,
    main_rows,
    memory_rows,
    profile_rows,
    recommendation_text,
    train_text,
    why_lines,
)

MIB = 1024**2


def _ok(name: str, *, items_per_s: float, peak_mib: int, speedup: float | None, cosine: float | None) -> dict:
    return {
        "name": name,
        "status": "ok",
        "native": name != "bf16-mixed",
        "native_note": "emulated (this CPU lacks avx512_bf16/amx_bf16)" if name == "bf16-mixed" else "native",
        "steps": {"measured": 10, "warmup": 2, "stalled": 1 if name == "fp32" else 0},
        "timing": {"items_per_s": items_per_s, "step_ms_median": 120.0, "step_ms_p10": 110.0, "step_ms_p90": 150.0},
        "mfu": {"value": 0.25, "peak_dtype": "fp32", "peak_source": "measured", "peak_flops": 1e11},
        "memory": {
            "peak_bytes": peak_mib * MIB,
            "run_bytes": peak_mib * MIB // 2,
            **(
                {"step_peak_bytes": 95 * MIB, "predicted_bytes": 100 * MIB, "predicted_source": "analytic"}
                | {"predicted_ratio": 0.95}
                if name == "fp32"
                else {}
            ),
        },
        "loss": {"final": 2.5, "at_common_step": 2.75},
        "budget": {"mode": "full", "few_steps": name == "bf16-mixed", "batch_size": 8, "reason": None},
        "profile": {
            "step_ms": 100.0,
            "shares": _shares(name),
            "ms": {k: 100 * v for k, v in _shares(name).items()},
            "matmul_ratio": None if name == "fp32" else 0.05,
            "amdahl_speedup": None if name == "fp32" else 0.0775,
        },
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


def _shares(name: str) -> dict:
    if name == "fp32":
        return {
            "matmul": 0.63,
            "norm": 0.07,
            "elementwise": 0.2,
            "casts": 0.0,
            "optimizer": 0.05,
            "data": 0.01,
            "other": 0.04,
        }
    return {
        "matmul": 0.5,
        "norm": 0.05,
        "elementwise": 0.15,
        "casts": 0.22,
        "optimizer": 0.04,
        "data": 0.01,
        "other": 0.03,
    }


def _summary() -> dict:
    failed = {"name": "fp16-mixed", "status": "failed", "error": "out of memory", "steps": None, "timing": None}
    failed.update({"mfu": None, "memory": None, "loss": None, "stability": None, "vs_fp32": None, "fidelity": None})
    untimed = {**failed, "name": "bf16-true", "status": "not-timed", "error": None, "native": False}
    untimed["budget"] = {"mode": "not-timed", "reason": "not timed: emulated, bf16 matmuls run at 0.05x fp32's speed"}
    return {
        "reference": "fp32",
        "unit": "tokens",
        "device": {"type": "cpu"},
        "loss_common_step": 12,
        "profile": {
            "categories": {"matmul": "matmul/attention"},
            "reference_matmul_share": 0.63,
            "ceiling_2x": 1 / (0.37 + 0.315),
            "ceiling_unbounded": 1 / 0.37,
            "cast_threshold": 0.1,
        },
        "recommendation": {
            "precision": "fp32",
            "reason": "fp32: every other precision was slower",
            "train": {
                "command": "ampkit train --model tiny --seq-len 256 --precision fp32 --batch-size 212",
                "batch_size": 212,
                "batch_source": "analytic",
                "batch_note": None,
                "capacity_bytes": 20 * 1024**3,
                "capacity_label": "available on this host (MemAvailable)",
                "expected_items_per_s": 1000.0,
                "measured_batch_size": 8,
            },
        },
        "precisions": [
            _ok("fp32", items_per_s=1000.0, peak_mib=1000, speedup=1.0, cosine=1.0),
            _ok("bf16-mixed", items_per_s=50.0, peak_mib=800, speedup=0.05, cosine=0.999987),
            failed,
            untimed,
        ],
    }


def test_main_rows_one_per_precision_with_status_words():
    headers, rows = main_rows(_summary())
    assert len(headers) == len(rows[0]) == 13
    fp32, bf16, fp16 = (dict(zip(headers, row)) for row in rows[:3])
    assert fp32["steps measured"] == "10 (+2 warmup), 1 stalled" and fp32["tokens/s"] == "1,000"
    assert fp32["processed tokens/s"] == "1,000"  # a summary without processed_per_s: nothing was masked
    assert fp32["status"] == "RECOMMENDED" and fp32["step ms median (p10-p90)"] == "120 (110-150)"
    assert bf16["vs fp32"] == "0.05x" and bf16["memory vs fp32"] == "0.80x" and bf16["logits cos"] == "0.999987"
    assert bf16["status"] == "good; emulated (this CPU lacks avx512_bf16/amx_bf16)" and bf16["MFU"] == "25.0% of fp32"
    assert fp16["status"] == "failed: out of memory" and fp16["tokens/s"] == "-"
    assert "loss @ step 12" in headers and fp32["loss @ step 12"] == "2.7500"
    assert bf16["steps measured"] == "10 (+2 warmup), few steps"
    bf16_true = dict(zip(headers, rows[3]))
    assert bf16_true["status"].startswith("not timed: emulated, bf16 matmuls run at 0.05x") and bf16_true["MFU"] == "-"


def test_the_profile_table_the_ceiling_and_the_train_command():
    headers, rows = profile_rows(_summary())
    assert headers[1] == "matmul/attention" and headers[-1] == "profiled step ms"
    assert rows[0] == ["fp32", "63%", "7%", "20%", "0%", "5%", "1%", "4%", "100"]
    assert sum(float(cell[:-1]) for cell in rows[1][1:-1]) == 100
    ceiling, bf16 = why_lines(_summary())
    assert ceiling.startswith("matmuls/attention are 63% of the fp32 step: even 2x faster matmuls give at most 1.46x")
    assert "Amdahl's law gives 0.077x" in bf16 and "autocast's dtype casts take 22% of its step" in bf16
    text = train_text(_summary())
    assert text.startswith("Train with it: ampkit train --model tiny --seq-len 256 --precision fp32 --batch-size 212")
    assert "the largest micro-batch the planner fits in the 20.0 GiB available" in text and "1,000 tokens/s" in text


def test_fidelity_and_memory_tables_skip_failed_precisions():
    _, fidelity = fidelity_rows(_summary())
    assert [r[0] for r in fidelity] == ["fp32", "bf16-mixed"]
    assert fidelity[0][-1] == "reference" and fidelity[1][-1] == "good" and fidelity[1][5] == "-"
    headers, memory = memory_rows(_summary())
    assert headers[1:3] == ["peak RSS", "run (growth)"]
    assert memory[1][:4] == ["bf16-mixed", "800 MiB", "400 MiB", "0.80x"]
    assert headers[4:] == ["step peak, measured (allocator)", "step peak, predicted (planner)", "measured / predicted"]
    assert memory[0][4:] == ["95 MiB", "100 MiB (analytic)", "0.950"]
    assert memory[1][5] == "not predicted"


def test_recommendation_text():
    assert recommendation_text(_summary()).startswith("Recommendation: fp32: every other precision was slower")
    none = {"recommendation": {"precision": None, "reason": "no recommendation: the fp32 reference failed"}}
    assert recommendation_text(none) == "No recommendation: the fp32 reference failed"


def test_the_train_command_for_a_task_and_a_python_task_object():
    from ampkit.bench.config import BenchConfig
    from ampkit.bench.train_command import train_command

    entry = {"name": "bf16-mixed", "timing": {"items_per_s": 9000.0}, "budget": {"batch_size": 8}}
    fit = {"batch_size": 6_683_610, "source": "traced", "capacity_bytes": 2**34, "capacity_label": "available"}
    task = {"name": "mlp", "unit": "samples", "train_samples": 2048}
    made = train_command(BenchConfig.of(task="mlp", batch_size=8), task, entry, fit)
    assert made["command"] == "ampkit train --task mlp --precision bf16-mixed --batch-size 2048"
    assert made["batch_note"] == "capped at its 2,048 training samples (the planner fits 6,683,610)"
    api = train_command(BenchConfig.of(batch_size=8), {"name": "mine", "unit": "samples"}, entry, {"batch_size": None})
    assert api["command"] == "ampkit.train.run(task, precision='bf16-mixed', batch_size=8)"
    assert api["batch_source"] is None and api["batch_note"] == "the planner found no batch that fits"


def test_the_train_command_of_a_lora_bench_is_a_lora_run():
    from ampkit.bench.config import BenchConfig
    from ampkit.bench.train_command import train_command
    from ampkit.lora import LoraSettings

    entry = {"name": "bf16-mixed", "timing": {"items_per_s": 900.0}, "budget": {"batch_size": 8}}
    fit = {"batch_size": 20, "source": "analytic", "capacity_bytes": 80 * 10**9, "capacity_label": "free"}
    lora = LoraSettings(lora=8, lora_targets="q_proj,v_proj", base_dtype="nf4")
    config = BenchConfig.of(model="7b", seq_len=512, batch_size=8, lora=lora)
    made = train_command(config, {"name": "lm", "unit": "tokens", "seq_len": 512}, entry, fit)
    assert made["command"] == (
        "ampkit train --model 7b --seq-len 512 --precision bf16-mixed --batch-size 20 "
        "--lora 8 --lora-targets q_proj,v_proj --base-dtype nf4"
    )
    api = train_command(BenchConfig.of(batch_size=8, lora=LoraSettings(lora=4)), {"name": "mine"}, entry, fit)
    assert api["command"] == "ampkit.train.run(task, precision='bf16-mixed', batch_size=20, lora=4)"


def test_processed_items_stand_beside_the_trained_ones_where_masks_make_them_differ():
    import io

    from rich.console import Console

    from ampkit.bench.render import console_table

    summary = {
        **_summary(),
        "model": {"preset": "tiny", "parameters": 1_000_000},
        "device": {"type": "cpu", "name": "CPU"},
        "data": {"seq_len": 256, "batch_size": 8},
    }
    for entry in summary["precisions"]:
        if entry["timing"]:
            entry["timing"]["processed_per_s"] = 2.5 * entry["timing"]["items_per_s"]  # prompts read, not trained
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(console_table(summary))
    text = out.getvalue()
    assert "processed/s" in text and "2,500" in text and "1,000" in text
    assert "processed/s: tokens read, masked ones too (MFU counts them)" in " ".join(text.split())
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    headers, rows = main_rows(summary)
    assert dict(zip(headers, rows[0]))["processed tokens/s"] == "2,500"
    plain = io.StringIO()  # text data: one rate, no column for the same number twice
    for entry in summary["precisions"]:
        if entry["timing"]:
            del entry["timing"]["processed_per_s"]
    Console(file=plain, width=80, color_system=None).print(console_table(summary))
    assert "processed/s" not in plain.getvalue()
