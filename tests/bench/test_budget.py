"""The budget is a promise (`ampkit.bench.budget`): the decisions on synthetic step times, and whole
benches on a simulated worker (the real worker's warmup/window logic on a fake clock) on an AVX2-only
CPU (bf16/fp16 emulated) and an AMX one (native), each within (budget x precisions + start-up +
fidelity) x 1.2."""

from __future__ import annotations

import dataclasses
import json

import pytest

import ampkit.bench.runner as runner
import ampkit.bench.session as session_mod
import ampkit.cli.bench as cli_bench
from ampkit.bench.budget import (
    EXIT_S,
    BudgetAccount,
    PrecisionPlan,
    ReferenceWarm,
    amdahl_speedup,
    bound_s,
    estimate_step_s,
    expected_warmup_s,
    fidelity_rows,
    measure_window,
    plan_precision,
    reduced_batch,
    warmup_plan,
)
from ampkit.bench.budget_text import took_line
from ampkit.bench.config import BenchConfig
from ampkit.bench.schema import validate_summary
from ampkit.cli import main
from bench_fakes import AMX_CPU, AVX2_CPU, MODEL_RATIOS, SimWorker, bound_holds, peaks_of, step_times


def test_amdahl_and_the_step_estimate():
    assert amdahl_speedup(0.63, 2.0) == pytest.approx(1.46, abs=0.005)  # the example
    assert amdahl_speedup(0.0, 10.0) == 1.0 and amdahl_speedup(1.0, 4.0) == pytest.approx(4.0)
    # emulated bf16 matmuls 20x slower on 60% of the step: 0.4 + 0.6 x 20 = 12.4x the fp32 step
    assert estimate_step_s(1.0, matmul_share=0.6, matmul_ratio=0.05) == pytest.approx(12.4)
    assert estimate_step_s(1.0, matmul_share=None, matmul_ratio=0.05) == pytest.approx(20.0)  # no profile: all of it
    assert estimate_step_s(2.0, matmul_share=0.5, matmul_ratio=None) == 2.0


def test_warmup_is_cut_to_half_the_budget_but_keeps_two_steps():
    assert warmup_plan(0.1, warmup_steps=3, budget_s=12) == 3
    assert warmup_plan(2.0, warmup_steps=3, budget_s=5) == 2  # 1 step affordable: cold + profiled stay
    assert warmup_plan(0.1, warmup_steps=0, budget_s=12) == 2


def test_min_steps_are_kept_within_twice_the_budget_and_the_allowance_only():
    normal = measure_window(0.5, budget_s=5, min_steps=5, max_measure_s=6)
    assert not normal.few_steps and normal.min_steps == 5
    within = measure_window(1.8, budget_s=5, min_steps=5, max_measure_s=10)  # 9 s <= 2 x 5 s: kept
    assert not within.few_steps and within.min_steps == 5
    tight = measure_window(1.8, budget_s=5, min_steps=5, max_measure_s=6)  # but not past the bench's allowance
    assert tight.few_steps and tight.min_steps == 1 and "what the bench's total allows" in tight.reason
    over = measure_window(3.0, budget_s=5, min_steps=5, max_measure_s=100)  # 15 s > 2 x 5 s
    assert over.few_steps and over.reason.startswith("few steps: 5 steps would take ~15 s, over 2x --budget-s 5")
    assert over.keep_going(0, 0.0, 3.0) and over.keep_going(1, 3.0, 3.0) is False  # 3 + 1.5 > 5: stop


def test_reduced_batch_fidelity_rows_and_the_account():
    assert reduced_batch(8, step_s=40.0, budget_s=5.0) == 1 and reduced_batch(8, 4.0, 5.0) == 2
    assert fidelity_rows(1.0, 8, 5.0) == 4 and fidelity_rows(40.0, 8, 5.0) == 1
    account = BudgetAccount(5.0)
    assert account.reference_allowance() == pytest.approx(6.0)
    account.timed = 3
    account.spend(6.0)
    assert account.allowance(still_to_come=1) == pytest.approx(18.0 - 6.0 - 5.0)
    assert bound_s(budget_s=5, timed=3, startup_s=20, fidelity_s=2) == pytest.approx(1.2 * 37)


def _ref(step_s: float) -> ReferenceWarm:
    return ReferenceWarm(step_s=step_s, batch_size=8, matmul_share=0.6, startup_s=3.0, fidelity_s=0.5)


def test_an_emulated_precision_too_slow_for_the_budget_is_not_timed_unless_named():
    config = BenchConfig.of(budget_s=5.0, batch_size=8)
    kwargs = {"matmul_ratio": 0.05, "emulated": True, "dtype": "bf16", "max_measure_s": 5.0}
    skipped = plan_precision("bf16-mixed", config, _ref(3.0), forced=False, **kwargs)
    assert skipped.mode == "not-timed" and not skipped.timed and skipped.fidelity_rows == 1
    assert (
        "bf16 matmuls run at 0.05x fp32's speed here" in skipped.reason and "--precisions bf16-mixed" in skipped.reason
    )
    forced = plan_precision("bf16-mixed", config, _ref(3.0), forced=True, **kwargs)
    assert forced.mode == "reduced-batch" and forced.batch_size == 1 and forced.reason.startswith("reduced batch 1")
    fits = plan_precision("bf16-mixed", config, _ref(0.05), forced=False, **kwargs)
    assert fits.mode == "full" and fits.batch_size == 8
    native = plan_precision("bf16-mixed", config, _ref(3.0), forced=False, **{**kwargs, "matmul_ratio": 3.7})
    assert native.mode == "full" and native.estimated_step_s < 3.0


def _run(tmp_path, capsys, monkeypatch, *, kind: str, fp32_step_s: float, argv=()):
    cpu = AVX2_CPU if kind == "avx2" else AMX_CPU
    monkeypatch.setattr(runner, "describe_device", lambda device: cpu)
    monkeypatch.setattr(runner, "measure_peaks", lambda info, precisions, device: peaks_of(kind))
    sim = SimWorker(monkeypatch, step_times(kind, fp32_step_s))
    monkeypatch.setattr(runner, "run_worker", sim)
    out = tmp_path / f"run-{kind}-{fp32_step_s}"
    code = main(["bench", "--seq-len", "32", "--batch-size", "8", *argv, "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert validate_summary(summary) == []
    return summary, sim, captured.err


@pytest.mark.parametrize("kind", ["avx2", "amx"])
@pytest.mark.parametrize("fp32_step_s, budget", [(0.09, 12.0), (0.09, 5.0), (2.5, 5.0), (2.5, 12.0), (30.0, 5.0)])
def test_the_whole_bench_keeps_its_promise(tmp_path, capsys, monkeypatch, kind, fp32_step_s, budget):
    """tiny-like (90 ms), small-like (2.5 s) and 7B-like (30 s) fp32 steps, budgets of 5 and 12 s."""
    summary, sim, err = _run(
        tmp_path, capsys, monkeypatch, kind=kind, fp32_step_s=fp32_step_s, argv=["--budget-s", str(budget)]
    )
    wall, bound = bound_holds(summary, sim)
    assert wall <= bound, (wall, bound, summary["budget"])
    assert "expected: ~" in err  # the expected total, printed before fp32's measured steps
    by_name = {e["name"]: e for e in summary["precisions"]}
    for entry in summary["precisions"]:
        mfu = entry["mfu"]
        assert mfu is None or mfu["value"] is None or mfu["value"] <= 1.0
    if kind == "avx2" and fp32_step_s >= 2.5:  # an emulated step of ~30 s and more: not timed, evidence shown
        assert by_name["bf16-mixed"]["status"] == "not-timed"
        assert "0.05x fp32's speed" in by_name["bf16-mixed"]["budget"]["reason"]
        assert by_name["bf16-mixed"]["fidelity"]["rows"] == 1  # fidelity always runs, on 1 row
        assert summary["recommendation"]["disqualified"]["bf16-mixed"].startswith("not timed: emulated")
    if kind == "amx":
        assert all(e["status"] == "ok" for e in summary["precisions"])


def test_naming_an_emulated_precision_times_it_on_a_reduced_batch(tmp_path, capsys, monkeypatch):
    summary, sim, _ = _run(
        tmp_path,
        capsys,
        monkeypatch,
        kind="avx2",
        fp32_step_s=2.5,
        argv=["--budget-s", "5", "--precisions", "bf16-mixed"],
    )
    bf16 = next(e for e in summary["precisions"] if e["name"] == "bf16-mixed")
    assert bf16["status"] == "ok" and bf16["budget"]["mode"] == "reduced-batch" and bf16["budget"]["batch_size"] == 1
    assert bf16["vs_fp32"]["same_batches"] is False and bf16["loss"]["at_common_step"] is None
    assert bf16["fidelity"]["loss_curve"]["steps_compared"] == 0  # other batches: no curve gap
    wall, bound = bound_holds(summary, sim)
    assert wall <= bound


def test_few_steps_are_flagged_and_losses_compared_at_equal_steps(tmp_path, capsys, monkeypatch):
    summary, _, _ = _run(tmp_path, capsys, monkeypatch, kind="amx", fp32_step_s=2.5, argv=["--budget-s", "5"])
    fp32 = summary["precisions"][0]
    assert fp32["budget"]["few_steps"] and fp32["steps"]["measured"] < 5
    from ampkit.bench.render import main_rows

    headers, rows = main_rows(summary)
    step = summary["loss_common_step"]
    assert f"loss @ step {step}" in headers and "few steps" in rows[0][1]
    curves = [e["loss"]["curve"] for e in summary["precisions"]]
    assert step == min(len(c) for c in curves)
    for entry in summary["precisions"]:
        assert entry["loss"]["at_common_step"] == entry["loss"]["curve"][step - 1]


def test_the_expected_warmup_and_total_follow_fp32s_own_warmup():
    config = BenchConfig.of(budget_s=12.0, batch_size=8, warmup_steps=3)
    ref = ReferenceWarm(
        step_s=0.3,
        batch_size=8,
        matmul_share=0.6,
        startup_s=2.5,
        fidelity_s=0.5,
        first_s=0.6,
        warmup_s=1.3,
        warmup_steps=3,
    )
    # 2x fp32's step: fp32's 1.3 s warmup (its cold first and profiled steps included) doubled, same steps
    assert expected_warmup_s(0.6, config, ref) == pytest.approx(2.6)
    # a 5 s step: its cold step (10 s) affords 2 warmup steps, one steady step fewer than fp32's
    assert expected_warmup_s(5.0, config, ref) == pytest.approx(5.0 / 0.3 * (1.3 - 0.3))
    bare = ReferenceWarm(step_s=0.3, batch_size=8, matmul_share=0.6, startup_s=2.5, fidelity_s=0.5)
    assert expected_warmup_s(0.6, config, bare) == pytest.approx(3 * 0.6)  # no warmup reported: its steps
    plan = plan_precision(
        "fp16-mixed",
        config,
        ref,
        matmul_ratio=0.35,
        emulated=True,
        forced=False,
        dtype="fp16",
        max_measure_s=14.4,
        ratio_source="step",
    )
    assert plan.mode == "full" and plan.estimated_step_s == pytest.approx(0.3 * (0.4 + 0.6 / 0.35))
    slowdown = plan.estimated_step_s / 0.3
    expected = 2.5 + 0.5 / 5 * 4 * slowdown + expected_warmup_s(plan.estimated_step_s, config, ref) + 12.0 + EXIT_S
    assert plan.estimated_total_s == pytest.approx(expected)
    # workers forked from the warm process (bench/zygote.py): a later one starts without fp32's imports
    forked = dataclasses.replace(ref, later_startup_s=0.4)
    args = dict(matmul_ratio=0.35, emulated=True, forced=False, dtype="fp16", max_measure_s=14.4, ratio_source="step")
    forked_plan = plan_precision("fp16-mixed", config, forked, **args)
    assert forked_plan.estimated_total_s == pytest.approx(expected - 2.5 + 0.4)
    slow = plan_precision(
        "fp16-mixed",
        config,
        ReferenceWarm(**{**ref.__dict__, "step_s": 9.0}),
        matmul_ratio=0.35,
        emulated=True,
        forced=False,
        dtype="fp16",
        max_measure_s=14.4,
        ratio_source="step",
    )
    assert isinstance(slow, PrecisionPlan) and slow.mode == "not-timed"
    assert "fp16 matmuls run at 0.35x fp32's speed here (this model's GEMMs, timed in fp32's worker)" in slow.reason


@pytest.mark.parametrize("fp32_step_s", [0.3, 1.0, 4.0])
def test_the_expected_time_is_within_30_percent_of_the_wall_on_both_kinds(
    tmp_path, capsys, monkeypatch, cpu_kind, fp32_step_s
):
    """Both CPU kinds' facts (`cpu_kind`), a world whose steps follow the model's own GEMMs (the probe's
    ratios, `MODEL_RATIOS`), not the peaks' large matmul: the announced total is within 30% of the wall."""
    monkeypatch.setattr(runner, "measure_peaks", lambda info, precisions, device: peaks_of(cpu_kind))
    world = step_times(cpu_kind, fp32_step_s, model=True)

    def bench(probe: dict | None, name: str) -> dict:
        sim = SimWorker(monkeypatch, world, probe=probe, startup_s=2.5)
        sim.install_clock(monkeypatch, runner, session_mod, cli_bench)
        monkeypatch.setattr(cli_bench, "process_age_s", lambda: 0.0)
        monkeypatch.setattr(runner, "run_worker", sim)
        code = main(["bench", "--seq-len", "32", "--batch-size", "8", "--out", str(tmp_path / name), "--json"])
        assert code == 0, capsys.readouterr().err
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert validate_summary(summary) == []
        return summary

    budget = bench(MODEL_RATIOS[cpu_kind], "probed")["budget"]
    assert budget["finished_s"] >= budget["wall_s"] > 0
    assert abs(budget["expected_s"] / budget["finished_s"] - 1.0) <= 0.3, budget
    assert budget["worker_startup_s"] == pytest.approx(3 * 2.5) and budget["warmup_s"] > 0
    if cpu_kind == "avx2" and fp32_step_s == 0.3:  # planned from the peaks' large matmul (20x), as before
        peaks_only = bench(None, "peaks")["budget"]
        assert peaks_only["expected_s"] > 1.3 * peaks_only["finished_s"], peaks_only


def test_the_end_line_says_what_it_took_against_what_it_announced():
    budget = {"expected_s": 55.4, "wall_s": 50.0, "finished_s": 52.1}
    assert took_line({"budget": budget}) == "took 52 s, expected ~55 s (+6%)"
    assert took_line({"budget": {**budget, "expected_s": None}}) is None
    assert took_line({"budget": None}) is None
