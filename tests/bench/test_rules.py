"""The seeds' decision rules (`bench/rules.py`) on synthetic bench summaries: each fires on its evidence
and stays silent without it."""

from __future__ import annotations

import pytest

from ampkit.bench.rules import UTILISATION_FLOOR, seed_rules, step_noise

GIB = 1024**3


def entry(name: str, speedup: float, *, spread: float = 0.02, peak_gib: float = 10, mfu: float = 0.4) -> dict:
    """A measured summary entry: step times of median 100 ms spread +/-`spread`, `speedup` over fp32."""
    return {
        "name": name,
        "status": "ok",
        "native": True,
        "timing": {"step_ms_median": 100.0, "step_ms_p10": 100 * (1 - spread), "step_ms_p90": 100 * (1 + spread)},
        "vs_fp32": {"speedup": speedup, "same_batches": True},
        "memory": {"peak_bytes": int(peak_gib * GIB)},
        "mfu": {"value": mfu},
        "budget": {"batch_size": 16},
    }


def fired(entries, precision, *, capacity_gib=80, parameters=None) -> dict:
    rec = {"precision": precision, "disqualified": {}}
    rules = seed_rules(entries, rec, capacity_bytes=int(capacity_gib * GIB), parameters=parameters)
    return {r["rule"]: r for r in rules}


def test_gain_inside_the_noise_says_fp32_is_fast_enough():
    rules = fired([entry("fp32", 1.0, spread=0.05), entry("bf16-mixed", 1.03)], "fp32", parameters=900_000)
    rule = rules["fp32-fast-enough"]
    assert rule["evidence"] == {
        "best": "bf16-mixed",
        "speedup": 1.03,
        "noise": pytest.approx(0.05),
        "parameters": 900_000,
    }
    assert "fp32 is fast enough" in rule["text"] and "0.9M parameters" in rule["text"]


def test_a_gain_or_a_loss_beyond_the_noise_or_an_emulated_dtype_does_not():
    assert "fp32-fast-enough" not in fired([entry("fp32", 1.0), entry("bf16-mixed", 2.5)], "bf16-mixed")
    assert "fp32-fast-enough" not in fired([entry("fp32", 1.0), entry("bf16-mixed", 0.5)], "fp32")
    emulated = {**entry("bf16-mixed", 1.0), "native": False}  # an AVX2 CPU's bf16: slow for want of hardware
    assert "fp32-fast-enough" not in fired([entry("fp32", 1.0), emulated], "fp32")


def test_noise_is_the_larger_step_time_spread():
    assert step_noise(entry("fp32", 1.0, spread=0.1)) == pytest.approx(0.1)
    rules = fired([entry("fp32", 1.0, spread=0.01), entry("fp16-mixed", 1.08, spread=0.1)], "fp16-mixed")
    assert rules["fp32-fast-enough"]["evidence"]["noise"] == pytest.approx(0.1)


def test_tf32_first_when_a_16_bit_regime_wins_and_memory_is_not_the_constraint():
    entries = [entry("fp32", 1.0), entry("tf32", 3.0), entry("fp16-mixed", 5.0)]
    rule = fired(entries, "fp16-mixed")["tf32-first"]
    assert rule["evidence"]["tf32_speedup"] == 3.0 and rule["evidence"]["chosen"] == "fp16-mixed"
    assert rule["evidence"]["chosen_loss_scaler"] is True
    assert rule["evidence"]["fp32_memory_fraction"] == pytest.approx(10 / 80)
    assert "TF32 first" in rule["text"] and "rollback" in rule["text"]


def test_no_tf32_first_when_memory_is_the_constraint_or_tf32_is_not_there():
    tight = [entry("fp32", 1.0, peak_gib=75), entry("tf32", 3.0, peak_gib=75), entry("bf16-mixed", 5.0)]
    assert "tf32-first" not in fired(tight, "bf16-mixed")
    assert "tf32-first" not in fired([entry("fp32", 1.0), entry("bf16-mixed", 5.0)], "bf16-mixed")  # a CPU
    assert "tf32-first" not in fired([entry("fp32", 1.0), entry("tf32", 3.0)], "tf32")


@pytest.mark.parametrize(("mfu", "verdict"), [(0.3, "checkpointing"), (0.6, "accumulation")])
def test_checkpointing_or_accumulation_by_measured_utilisation(mfu, verdict):
    entries = [entry("fp32", 1.0, peak_gib=76, mfu=mfu), entry("bf16-mixed", 3.0, peak_gib=70, mfu=mfu)]
    rule = fired(entries, "bf16-mixed")["checkpointing-or-accumulation"]
    assert rule["evidence"]["verdict"] == verdict and rule["evidence"]["floor"] == UTILISATION_FLOOR
    assert rule["evidence"]["memory_fraction"] == pytest.approx(76 / 80)
    assert ("activation checkpointing" if verdict == "checkpointing" else "--grad-accum") in rule["text"]


def test_no_memory_rule_far_from_the_devices_memory():
    entries = [entry("fp32", 1.0, peak_gib=10, mfu=0.3), entry("bf16-mixed", 3.0, peak_gib=8, mfu=0.3)]
    assert "checkpointing-or-accumulation" not in fired(entries, "bf16-mixed")


def test_a_bench_records_the_rules_evidence_in_summary_json(tmp_path, capsys, monkeypatch):
    """The pipeline on the fake clock (bench_fakes.SimWorker): bf16 no faster than fp32 on a bf16-native CPU."""
    import json

    import ampkit.bench.runner as runner
    from ampkit.bench.schema import validate_summary
    from ampkit.cli import main
    from bench_fakes import AMX_CPU, SimWorker, peaks_of

    monkeypatch.setattr(runner, "describe_device", lambda device: AMX_CPU)
    monkeypatch.setattr(runner, "measure_peaks", lambda info, precisions, device: peaks_of("amx"))
    monkeypatch.setattr(runner, "run_worker", SimWorker(monkeypatch, {"fp32": 0.05, "bf16-mixed": 0.05}))
    out = tmp_path / "run"
    assert main(["bench", "--precisions", "bf16-mixed", "--steps", "4", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert validate_summary(summary) == []
    rec = summary["recommendation"]
    rule = next(r for r in rec["rules"] if r["rule"] == "fp32-fast-enough")
    assert rule["evidence"]["best"] == "bf16-mixed" and rule["evidence"]["speedup"] == pytest.approx(1.0, abs=0.01)
    assert rule["text"] in rec["advice"] and "fp32 is fast enough" in capsys.readouterr().out


def _timed(name: str, median_ms: float, spread: float = 0.02) -> dict:
    e = entry(name, 1.0, spread=spread)
    e["timing"] = {
        "step_ms_median": median_ms,
        "step_ms_p10": median_ms * (1 - spread),
        "step_ms_p90": median_ms * (1 + spread),
    }
    return e


def test_an_island_beside_its_plain_candidate_gets_its_step_time_cost():
    entries = [_timed("fp32", 200), _timed("bf16-mixed", 100), _timed("bf16-mixed@blocks.1.mlp=fp32", 115)]
    rules = [r for r in seed_rules(entries, {"precision": "bf16-mixed"}, capacity_bytes=80 * GIB, parameters=None)]
    (island,) = [r for r in rules if r["rule"] == "island-cost"]
    assert island["evidence"]["base"] == "bf16-mixed" and island["evidence"]["verdict"] == "slower"
    assert island["evidence"]["cost"] == pytest.approx(0.15)
    assert "blocks.1.mlp=fp32 costs +15% step time over bf16-mixed" in island["text"]


def test_an_island_cost_inside_the_noise_says_so_and_none_without_its_plain_candidate():
    noisy = [_timed("fp32", 200), _timed("bf16-mixed", 100, 0.2), _timed("bf16-mixed@head=fp32", 105)]
    (rule,) = [
        r
        for r in seed_rules(noisy, {"precision": "fp32"}, capacity_bytes=0, parameters=None)
        if r["rule"] == "island-cost"
    ]
    assert rule["evidence"]["verdict"] == "inside the noise"
    alone = [_timed("fp32", 200), _timed("bf16-mixed@head=fp32", 105)]
    assert not [
        r
        for r in seed_rules(alone, {"precision": "fp32"}, capacity_bytes=0, parameters=None)
        if r["rule"] == "island-cost"
    ]
