"""`ampkit plan` on any transformers architecture: the traced engine answers where the analytic one
does not (ledger, fit, advice), and cross-checks it where it does."""

from __future__ import annotations

import json

import pytest

from ampkit.cli import main
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.engines import AnalyticEngine, hf_traced_engine, primary_engine
from ampkit.plan.planner import build_plan
from ampkit.plan.setting import NO_RESERVE, StepSetting
from hf_archs import save_tiny

pytest.importorskip("transformers")


def plan_json(capsys, *args):
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_new_architecture_is_planned_by_the_traced_engine(tmp_path, capsys):
    save_tiny(tmp_path / "m", "qwen3", layers=8)
    summary = plan_json(
        capsys,
        *("--model", f"hf:{tmp_path / 'm'}", "--gpu-mem", "1GiB", "--precisions", "bf16-mixed"),
        *("--checkpointing", "none", "--seq-len", "64", "--out", str(tmp_path / "run")),
    )
    assert summary["engine"] == "traced" and summary["model"]["architecture"] == "Qwen3ForCausalLM"
    assert summary["model"]["layers"]["identical"]
    for row in summary["rows"]:
        assert row["analytic"] is None and row["traced"] == row["ledger"]
        assert "extrapolated from traces of 1 and 2 layers" in row["trace_note"]
        assert row["fit"]["fits"] and row["fit"]["max_micro_batch"] > 1 and row["fit"]["max_seq_len"] >= 64
    assert summary["recommendation"]["fits"]


def test_mixture_of_experts_flops_come_from_the_active_parameters(tmp_path, capsys):
    save_tiny(tmp_path / "m", "mixtral", layers=4)
    summary = plan_json(
        capsys,
        *("--model", f"hf:{tmp_path / 'm'}", "--precisions", "bf16-mixed", "--checkpointing", "none"),
        *("--seq-len", "32", "--out", str(tmp_path / "run")),
    )
    model = summary["model"]
    assert model["experts"] == 4 and model["experts_per_token"] == 2
    assert model["active_parameters"] < model["num_parameters"]
    flops = summary["rows"][0]["compute"]["flops_per_token"]
    attention = 12 * model["n_layers"] * model["n_heads"] * model["head_dim"] * 32
    assert flops == 6 * model["matmul_parameters"] + attention


def test_the_cheapest_fix_is_found_by_tracing(tmp_path):
    save_tiny(tmp_path, "olmo2", layers=8)
    desc = describe_model(f"hf:{tmp_path}")
    config = PlanConfig(
        model=f"hf:{tmp_path}",
        gpu_mem="3MiB",
        precisions="fp32",
        activation_checkpointing="none",
        seq_len=64,
        batch_size=8,
        context_gib=0.0,
    )
    summary = build_plan(config, desc=desc)
    rec = summary["recommendation"]
    assert not rec["fits"] and rec["fix"] is not None
    assert rec["fix"]["total_bytes"] <= summary["target"]["capacity_bytes"]


def test_analytic_families_are_cross_checked_with_transformers_own_modules(tmp_path, capsys):
    save_tiny(tmp_path / "m", "llama", layers=6)
    summary = plan_json(
        capsys,
        *("--model", f"hf:{tmp_path / 'm'}", "--precisions", "fp32,bf16-mixed", "--checkpointing", "none,full"),
        *("--seq-len", "64", "--out", str(tmp_path / "run")),
    )
    assert summary["engine"] == "analytic"
    for row in summary["rows"]:
        assert row["analytic"] == row["ledger"] and row["traced"] and row["agreement"] is not None
        assert abs(row["agreement"]["tensor_peak_relative"]) < 0.25  # transformers' Llama vs ampkit's replay


def test_engines_for_presets_and_hf_models(tmp_path):
    preset = describe_model("tiny")
    engine = primary_engine(preset, reserve=NO_RESERVE)
    assert isinstance(engine, AnalyticEngine) and hf_traced_engine(preset, engine) is None
    setting = StepSetting(precision="bf16-mixed", micro_batch=2, seq_len=64)
    assert engine.ledger(setting) == analytic_ledger(preset, setting, reserve=NO_RESERVE)
    save_tiny(tmp_path, "phi", layers=4)
    desc = describe_model(f"hf:{tmp_path}")
    traced = primary_engine(desc)
    assert traced.name == "traced" and hf_traced_engine(desc, traced) is traced


def test_console_tables_and_report_of_a_traced_only_plan(tmp_path, capsys):
    save_tiny(tmp_path / "m", "qwen3_moe", layers=4)
    code = main(
        [
            *("plan", "--model", f"hf:{tmp_path / 'm'}", "--gpu", "A100-80GB", "--precisions", "bf16-mixed"),
            *("--checkpointing", "none", "--seq-len", "32", "--out", str(tmp_path / "run")),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Qwen3MoeForCausalLM" in out and "active parameters per token" in out and "traced only" in out
    assert "(2 of 4 experts)" in out and "Analytic vs traced" in out
    assert (tmp_path / "run" / "report.html").is_file()


def test_a_step_that_surely_does_not_fit_has_its_fix_search_traced_with_the_rows(tmp_path, monkeypatch):
    """`_sure_fix_search`: weights, gradients and states alone over the GPU -> the steps `cheapest_fix`
    asks for (`advice.fix_settings`) are prefetched with the rows; after them the search traces nothing."""
    from ampkit.plan import planner
    from ampkit.plan.advice import cheapest_fix
    from ampkit.plan.fit import resolve_target
    from ampkit.plan.traced import forked
    from ampkit.plan.traced.extrapolate import HFTracedEngine

    monkeypatch.setenv(forked.WORKERS_ENV, "2")  # a child whatever the load
    if not forked.can_fork():
        pytest.skip("forking is not offered here (see plan/traced/forked.py)")
    save_tiny(tmp_path, "qwen3", layers=8)
    desc = describe_model(f"hf:{tmp_path}")
    config = PlanConfig(model=f"hf:{tmp_path}", gpu_mem="1MiB", precisions="fp32", seq_len=32, context_gib=0.0)
    target = resolve_target(config.gpu, config.gpu_mem)
    extra = planner._sure_fix_search(desc, config, target)
    assert extra and extra[0].precision == "bf16-mixed"  # no GPU named: the recommendation's precision
    roomy = PlanConfig(model=f"hf:{tmp_path}", gpu_mem="80GiB", precisions="fp32", seq_len=32)
    assert planner._sure_fix_search(desc, roomy, resolve_target(roomy.gpu, roomy.gpu_mem)) == []
    engine = HFTracedEngine(desc)
    engine.prefetch(
        planner.settings_of(config.for_model(desc.max_positions)), capacity=target.capacity_bytes, extra=extra
    )
    traced = engine.steps.traced
    fix = cheapest_fix(desc, extra[0], target.capacity_bytes, gpu=None, engine=engine)  # every candidate, then FSDP
    assert fix is None or fix.total_bytes <= target.capacity_bytes
    assert engine.steps.traced == traced
