"""The planner's LoRA ledger (`plan --lora`): the analytic replay against the traced step within 1%, the
traced step against a real CPU step's allocator peak within 5%, what each line holds (the frozen base
in its dtype, no gradients or optimizer states for it; fp32 adapters with AdamW states), and 7b's full
fine-tuning vs LoRA vs QLoRA on an A100-80GB."""

from __future__ import annotations

import json

import pytest

from ampkit.lora import LoraSettings
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import describe_config, describe_model
from ampkit.plan.fit import resolve_target
from ampkit.plan.fit_check import check_fit
from ampkit.plan.lora.ledger import (
    LoraPlan,
    adapter_tensors,
    analytic_lora_ledger,
    base_bytes,
    lora_dims,
    lora_largest,
    nf4_bytes,
)
from ampkit.plan.lora.plan import build_lora_plan, lora_precisions
from ampkit.plan.lora.replay import Flow, LoraReplay
from ampkit.plan.lora.trace import measure_lora_cpu_step_peak, traced_lora_ledger
from ampkit.plan.setting import GIB, StepSetting

pytest.importorskip("peft")
TINY = describe_model("tiny")
GQA = describe_config(
    {
        "model_type": "llama",
        "hidden_size": 96,
        "intermediate_size": 200,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 300,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
    name="gqa",
)


def _plan(precision: str, base: str = "auto", targets: str = "", rank: int = 8) -> LoraPlan:
    return LoraPlan(settings=LoraSettings(lora=rank, base_dtype=base, lora_targets=targets), precision=precision)


CASES = [
    ("bf16-mixed", "auto", ""),
    ("bf16-mixed", "nf4", ""),
    ("fp32", "auto", ""),
    ("fp16-mixed", "auto", "q_proj,v_proj"),
    ("bf16-mixed", "fp32", ""),
]


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize(("precision", "base", "targets"), CASES)
@pytest.mark.parametrize("desc", [TINY, GQA], ids=["tiny", "gqa"])
def test_analytic_agrees_with_traced_within_1_percent(desc, precision, base, targets, checkpointing):
    setting = StepSetting(precision=precision, micro_batch=2, seq_len=64, checkpointing=checkpointing)
    plan = _plan(precision, base, targets)
    analytic, traced = analytic_lora_ledger(desc, setting, plan), traced_lora_ledger(desc, setting, plan)
    assert abs(analytic.tensor_peak - traced.tensor_peak) <= 0.01 * traced.tensor_peak, (analytic, traced)
    for line in ("parameters", "optimizer_states"):  # the static lines are exact
        assert analytic.at_peak[line] == traced.at_peak[line]


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "base"), [("bf16-mixed", "auto"), ("bf16-mixed", "nf4"), ("fp32", "auto")])
def test_traced_agrees_with_a_real_cpu_step_within_5_percent(precision, base):
    setting = StepSetting(precision=precision, micro_batch=2, seq_len=64)
    plan = _plan(precision, base)
    traced = traced_lora_ledger(TINY, setting, plan).tensor_peak
    measured = measure_lora_cpu_step_peak(TINY, setting, plan)
    assert abs(traced - measured) <= 0.05 * measured, (traced, measured)


def test_lines_hold_a_frozen_base_and_fp32_adapters():
    setting = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=128, optimizer="adamw", grad_accum=2)
    plan = _plan("bf16-mixed")
    dims = lora_dims(TINY, setting, plan)
    adapters = adapter_tensors(TINY, dims, plan)
    assert sum(adapters) == 81_920 and len(adapters) == 4 * 7 * 2
    assert base_bytes(TINY, dims, plan) == 2 * TINY.num_parameters()  # every base weight in bf16
    ledger = analytic_lora_ledger(TINY, setting, plan)
    assert ledger.largest["parameters"] == 2 * TINY.num_parameters() + 4 * 81_920
    assert ledger.largest["optimizer_states"] == 2 * 4 * 81_920 + 4 * len(adapters)  # AdamW: two fp32 states
    assert ledger.largest["gradients"] == 4 * 81_920  # held between micro-batches: the adapters' only
    nf4 = lora_dims(TINY, setting, _plan("bf16-mixed", "nf4"))
    assert nf4.nf4 and base_bytes(TINY, nf4, _plan("bf16-mixed", "nf4")) < base_bytes(TINY, dims, plan) / 2
    assert nf4_bytes(128 * 128) == 8192 + 256 + 4 + 1092  # 4 bits + 8-bit scales + fp32 scales + code tables


def test_requires_grad_flow():
    replay = LoraReplay(
        lora_dims(TINY, StepSetting(precision="fp32"), _plan("fp32")),
        n_layers=2,
        tokens=1,
        seq_len=1,
        head_dim=32,
        static={},
    )
    replay.adapted = {"down_proj"}
    assert replay.flow(0) == Flow(x=False, qkv=False, x2=False, mlp=False)  # only the down adapter learns
    assert replay.flow(1).x and replay.flow(1).input_grad("q_proj")
    replay.adapted = {"q_proj"}
    assert replay.flow(0) == Flow(x=False, qkv=True, x2=True, mlp=True)


def test_7b_full_vs_lora_vs_qlora_on_an_a100():
    config = PlanConfig(model="7b", gpu="A100-80GB", seq_len=2048, lora=LoraSettings(lora=16))
    summary = build_lora_plan(config, desc=describe_model("7b"))
    methods = {m["method"]: m for m in summary["methods"]["methods"]}
    full, lora, qlora = methods["full fine-tuning"], methods["LoRA"], methods["QLoRA (nf4)"]
    assert summary["methods"]["precision"] == "bf16-mixed"
    assert not full["fits"] and full["max_micro_batch"] == 0
    assert lora["fits"] and qlora["fits"] and qlora["max_micro_batch"] >= lora["max_micro_batch"] >= 1
    assert qlora["lines_at_peak_bytes"]["parameters"] < lora["lines_at_peak_bytes"]["parameters"] / 3
    assert full["total_gib"] > 100 > lora["total_gib"] > qlora["total_gib"]
    assert lora["lines_at_peak_bytes"]["optimizer_states"] < 0.01 * full["lines_at_peak_bytes"]["optimizer_states"]
    assert [r["setting"]["precision"] for r in summary["rows"]][::2] == ["fp32", "tf32", "fp16-mixed", "bf16-mixed"]


def test_largest_micro_batch_is_the_edge_of_fitting():
    setting = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=2048)
    plan = _plan("bf16-mixed", rank=16)
    capacity = resolve_target("A100-80GB", None).capacity_bytes
    best = lora_largest(describe_model("7b"), setting, plan, capacity)
    fits = [
        analytic_lora_ledger(
            describe_model("7b"), StepSetting(precision="bf16-mixed", micro_batch=m, seq_len=2048), plan
        ).total
        <= capacity
        for m in (best, best + 1)
    ]
    assert fits == [True, False]


def test_fit_check_plans_a_lora_run_with_the_lora_ledger():
    full = analytic_ledger(describe_model("7b"), StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=2048))
    lora = analytic_lora_ledger(
        describe_model("7b"), StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=2048), _plan("bf16-mixed")
    )
    assert lora.total < full.total / 3
    import torch

    estimate = check_fit(
        model="tiny",
        precision="bf16-mixed",
        batch_size=2,
        seq_len=32,
        device=torch.device("cpu"),
        vocab_size=256,
        lora=LoraSettings(lora=8),
    )
    assert estimate is None or estimate.fits


def test_refusals(run_cli, tmp_path):
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(
        json.dumps(
            {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 64}
        )
    )
    cases = [
        (["--model", str(gpt2), "--lora", "8"], "plans Llama-shaped models"),
        (["--model", "tiny", "--lora", "8", "--precisions", "bf16-true"], "plan --lora plans fp32"),
        (["--model", "tiny", "--lora", "8", "--parallel", "fsdp", "--world-size", "2"], "plans one process"),
        (["--model", "tiny", "--lora", "8", "--lora-targets", "blocks.*"], "adapts a Llama block's projections"),
        (["--model", "tiny", "--lora", "0"], "must be >= 1"),
    ]
    for argv, words in cases:
        code, _, err = run_cli("plan", *argv, "--out", str(tmp_path / "out"))
        assert code == 2 and words in err, (argv, err)
    assert lora_precisions(PlanConfig(lora=LoraSettings(lora=8))) == ["fp32", "tf32", "fp16-mixed", "bf16-mixed"]


def test_plan_cli_prints_the_side_by_side(run_cli, tmp_path):
    code, out, err = run_cli(
        "plan",
        "--model",
        "7b",
        "--lora",
        "16",
        "--base-dtype",
        "nf4",
        "--gpu",
        "A100-80GB",
        "--precisions",
        "bf16-mixed",
        "--checkpointing",
        "none",
        "--out",
        str(tmp_path / "p"),
    )
    assert code == 0, err
    assert "full fine-tuning vs LoRA vs QLoRA on A100-80GB" in out and "QLoRA (nf4)" in out
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["rows"][0]["lora"]["base_dtype"] == "nf4" and summary["rows"][0]["fit"]["fits"]
    assert summary["rows"][0]["analytic"]["total_gib"] < 40 * GIB / GIB
