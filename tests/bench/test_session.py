"""`ampkit.bench.session`: fp32's warmup report makes every other precision's plan and the expected
total before fp32's measured steps; later workers get what the bench's allowance leaves."""

from __future__ import annotations

from rich.console import Console

from ampkit.bench.config import BenchConfig
from ampkit.bench.runner import BenchPlan
from ampkit.bench.session import BenchSession
from bench_fakes import AVX2_CPU, peaks_of


class Progress:
    def __init__(self):
        self.ends = []

    def set_expected_end(self, when: float) -> None:
        self.ends.append(when)


def _session(console, **config) -> tuple[BenchSession, list]:
    cfg = BenchConfig.of(model="tiny", seq_len=32, batch_size=8, precisions="fp32,bf16-mixed,fp16-mixed", **config)
    plan = BenchPlan(
        config=cfg, info=AVX2_CPU, precisions=["fp32", "bf16-mixed", "fp16-mixed"], warnings=[], task={"unit": "tokens"}
    )
    calls: list = []

    def measure(name, job_plan, on_event):
        calls.append((name, job_plan))
        if name == "fp32":  # its warmup report, then its measured steps
            on_event(
                {
                    "event": "warm",
                    "step_s": 2.0,
                    "batch_size": 8,
                    "matmul_share": 0.6,
                    "startup_s": 3.0,
                    "fidelity_s": 1.0,
                }
            )
            calls.append(("printed before fp32 measured", console.export_text()))
        elif job_plan.timed:  # a later worker's own warmup report: its measured step
            ends = len(session.progress.ends)
            on_event({"event": "warm", "step_s": 1.5, "batch_size": 8})
            calls.append(("time left corrected", len(session.progress.ends) > ends))
        plan = {"fidelity_s": 0.5, "startup_s": 3.0, "warmup_s": 4.0}
        return {"precision": name, "status": "ok", "step_s": [2.0] * 3, "plan": plan, "worker_s": 15.0}

    session = BenchSession(plan, console, Progress(), peaks_of("avx2"), measure=measure, started=0.0)
    return session, calls


def test_plans_and_the_expected_total_come_before_fp32_measures():
    console = Console(record=True, width=300)
    session, calls = _session(console, budget_s=5.0)
    results = session.run(refuse=lambda result: None)
    assert [r["precision"] for r in results] == ["fp32", "bf16-mixed", "fp16-mixed"]
    printed = calls[1][1]
    assert printed.startswith("expected: ~") and "fp32 ~2.00 s/step" in printed
    # bf16 emulated 20x on 60% of a 2 s step: ~25 s > 5 s: not timed; fp16 5x: ~6.8 s: not timed either
    assert "bf16-mixed not timed: emulated, bf16 matmuls run at 0.05x" in printed
    plans = {name: plan for name, plan in calls if hasattr(plan, "mode")}
    assert plans["bf16-mixed"].mode == "not-timed" and plans["fp16-mixed"].mode == "not-timed"
    assert plans["fp32"].probe == {"bf16": 0.05, "fp16": 0.2}  # fp32's worker times its GEMMs in both, bounded
    assert session.account.timed == 1 and session.progress.ends
    block = session.budget_block(results, wall_s=60.0)
    assert block["measured_s"] == 18.0 and block["fidelity_s"] == 1.5 and block["startup_s"] == 60.0 - 19.5
    assert block["bound_s"] == 1.2 * (5.0 * 3 + block["startup_s"] + 1.5) and block["within_bound"]
    # where the start-up went: each worker's start (process to the run built), their warmup, the bench's own
    assert block["worker_startup_s"] == 9.0 and block["warmup_s"] == 12.0 and block["parent_s"] == 60.0 - 45.0


def test_named_precisions_are_timed_and_share_the_allowance():
    console = Console(record=True, width=300)
    session, calls = _session(console, budget_s=30.0)
    session.plan = BenchPlan(**{**session.plan.__dict__, "requested": ("bf16-mixed", "fp16-mixed")})
    session.run(refuse=lambda result: None)
    plans = {name: plan for name, plan in calls if hasattr(plan, "mode")}
    assert plans["fp32"].max_measure_s == 1.2 * 30.0
    assert plans["bf16-mixed"].mode == "full" and plans["fp16-mixed"].mode == "full"  # ~25 s and ~6.8 s fit 30 s
    assert session.account.timed == 3
    # 1.2 x 30 x 3 = 108 s; fp32 spent 6 s; one budget (30 s) reserved for fp16-mixed
    assert plans["bf16-mixed"].max_measure_s == 108.0 - 6.0 - 30.0
    corrected = [done for name, done in calls if name == "time left corrected"]
    assert corrected == [True, True]  # each later worker's warmup report moved the progress bar's expected end
