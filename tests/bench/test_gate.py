"""The convergence gate (`bench --gate G --steps N`): synthetic loss curves, the bench pipeline on the fake
clock (exit status 3 when the recommended candidate fails), a real tiny bench, and the one-line refusals."""

from __future__ import annotations

import json
import math

import pytest

import ampkit.bench.runner as runner
from ampkit.bench.config import BenchConfig
from ampkit.bench.gate import GATE_EXIT, convergence_gate
from ampkit.bench.schema import validate_summary
from ampkit.cli import main
from ampkit.errors import UsageError
from bench_fakes import AMX_CPU, SimWorker, peaks_of

FP32 = [5.0, 4.8, 4.6, 4.5, 4.4, 4.3]


def test_gate_passes_within_and_fails_beyond_the_gap_after_warm_up():
    within = [v + 0.004 for v in FP32]
    found = convergence_gate(FP32, within, gate=0.01, warmup=2)
    assert found["passed"] and found["steps_compared"] == 4 and (found["first_step"], found["last_step"]) == (3, 6)
    assert found["max_gap"] == pytest.approx(0.004)
    late = [*FP32[:4], FP32[4] + 0.03, FP32[5]]  # one step over the gate
    found = convergence_gate(FP32, late, gate=0.01, warmup=2)
    assert not found["passed"] and found["worst_step"] == 5 and found["max_gap"] == pytest.approx(0.03)


def test_warm_up_steps_are_not_gated_and_matched_steps_stop_at_the_shorter_curve():
    early = [FP32[0] + 0.5, FP32[1] + 0.5, *FP32[2:5]]  # a large gap only while warming up; one step fewer
    found = convergence_gate(FP32, early, gate=0.01, warmup=2)
    assert found["passed"] and found["last_step"] == 5 and found["steps_compared"] == 3
    assert not convergence_gate(FP32, early, gate=0.01, warmup=0)["passed"]


def test_a_non_finite_loss_or_no_matched_step_fails():
    nan = [*FP32[:3], math.nan, *FP32[4:]]
    found = convergence_gate(FP32, nan, gate=0.01, warmup=1)
    assert not found["passed"] and found["max_gap"] == math.inf and found["worst_step"] == 4
    assert not convergence_gate(FP32, [*FP32[:3], None, *FP32[4:]], gate=1.0, warmup=1)["passed"]
    short = convergence_gate(FP32, FP32[:2], gate=0.01, warmup=2)
    assert not short["passed"] and short["steps_compared"] == 0 and "raise --steps" in short["reason"]


def test_a_gate_needs_fixed_steps_and_a_non_negative_gap():
    with pytest.raises(UsageError, match="give a fixed --steps too"):
        BenchConfig.of(gate=0.01)
    with pytest.raises(UsageError, match="--gate must be a loss gap >= 0"):
        BenchConfig.of(gate=-0.1, steps=5)
    assert BenchConfig.of(gate=0.01, steps=5).gate == 0.01


def test_gate_without_steps_is_one_line_exit_2(capsys):
    code = main(["bench", "--gate", "0.01", "--precisions", "fp32"])
    err = capsys.readouterr().err
    assert code == 2 and "--steps" in err and len(err.strip().splitlines()) == 1


@pytest.fixture
def amx_cpu(monkeypatch):
    """bf16 native: a faster bf16-mixed is the recommendation."""
    monkeypatch.setattr(runner, "describe_device", lambda device: AMX_CPU)
    monkeypatch.setattr(runner, "measure_peaks", lambda info, precisions, device: peaks_of("amx"))


def _gated_bench(tmp_path, capsys, monkeypatch, gate: str):
    worker = SimWorker(monkeypatch, {"fp32": 0.05, "bf16-mixed": 0.02}, loss_drift={"bf16-mixed": 0.004})
    monkeypatch.setattr(runner, "run_worker", worker)
    out = tmp_path / f"run-{gate}"
    argv = ["bench", "--precisions", "bf16-mixed", "--steps", "6", "--warmup-steps", "2", "--gate", gate]
    code = main([*argv, "--out", str(out)])
    stdout = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert validate_summary(summary) == []
    return code, stdout, summary


def test_bench_exits_3_when_the_recommended_candidate_fails_the_gate(tmp_path, capsys, monkeypatch, amx_cpu):
    code, stdout, summary = _gated_bench(tmp_path, capsys, monkeypatch, "0.01")
    assert summary["recommendation"]["precision"] == "bf16-mixed"
    bf16 = next(e for e in summary["precisions"] if e["name"] == "bf16-mixed")
    # 2 untimed + 6 measured steps, the loss drifting 0.004 a step: over 0.01 from the third step on
    assert bf16["gate"]["steps_compared"] == 6 and not bf16["gate"]["passed"]
    assert bf16["gate"]["max_gap"] == pytest.approx(8 * 0.004, rel=1e-3) and bf16["gate"]["worst_step"] == 8
    gate = summary["gate"]
    assert (gate["passed"], gate["exit_status"], gate["candidates"]) == (False, 3, {"fp32": True, "bf16-mixed": False})
    assert code == GATE_EXIT and "convergence gate 0.01: bf16-mixed FAILS" in stdout


def test_bench_exits_0_when_the_recommended_candidate_passes(tmp_path, capsys, monkeypatch, amx_cpu):
    code, stdout, summary = _gated_bench(tmp_path, capsys, monkeypatch, "0.5")
    assert code == 0 and summary["gate"]["passed"] and summary["gate"]["exit_status"] == 0
    assert "convergence gate 0.5: bf16-mixed passes" in stdout


def test_a_real_tiny_bench_records_each_candidates_gap(real_runs):
    """tests/helpers.py's shared bench: fp32 and bf16-mixed, --steps 3 after 2 untimed steps, --gate 10."""
    summary = json.loads((real_runs["bench"].run_dir / "summary.json").read_text())
    by_name = {e["name"]: e["gate"] for e in summary["precisions"]}
    assert by_name["fp32"]["max_gap"] == 0.0 and by_name["fp32"]["passed"]
    bf16 = by_name["bf16-mixed"]
    fp32_curve = summary["precisions"][0]["loss"]["curve"]
    bf16_curve = summary["precisions"][1]["loss"]["curve"]
    expected = max(abs(a - b) for a, b in zip(fp32_curve[2:], bf16_curve[2:]))
    assert bf16["steps_compared"] == 3 and bf16["max_gap"] == pytest.approx(expected) and bf16["passed"]
    assert summary["gate"]["passed"] and summary["gate"]["exit_status"] == 0


def test_the_gate_is_a_key_of_benchs_config_file(tmp_path):
    from ampkit.config import resolve_config

    path = tmp_path / "bench.toml"
    path.write_text("gate = 0.01\nsteps = 20\n")
    config = resolve_config(BenchConfig, toml_path=path)
    assert (config.gate, config.steps) == (0.01, 20)
    path.write_text("gate = 0.01\n")
    with pytest.raises(UsageError, match="--steps"):
        resolve_config(BenchConfig, toml_path=path)


@pytest.mark.parametrize(
    ("argv", "mode"),
    [(["--inference"], "--inference"), (["--sweep", "baseline"], "--sweep")],
)
def test_gate_is_refused_where_bench_compares_no_losses(capsys, argv, mode):
    """bench --inference trains nothing, --sweep runs one precision's switches: no fp32 curve to gate on."""
    code = main(["bench", "--gate", "0.01", "--steps", "5", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"bench {mode} has none" in err and "drop it" in err and "Traceback" not in err


def test_the_gate_refusal_under_inference_holds_for_the_python_api():
    with pytest.raises(UsageError, match="bench --inference has none"):
        BenchConfig.of(gate=0.01, steps=5, inference=True)
