"""Compute figures (the seeds'), memory parsing, fitting on a GPU, and advice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ampkit.errors import UsageError
from ampkit.hardware import lookup_gpu
from ampkit.models import PRESETS
from ampkit.models.flops import training_flops_per_token
from ampkit.plan.advice import base_precision, cheapest_fix
from ampkit.plan.analytic.compute import flops_per_token, model_flops_per_token, seconds_at, step_compute, weights_gb
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.describe import describe_model
from ampkit.plan.fit import largest, parse_memory, resolve_target
from ampkit.plan.setting import GIB, StepSetting


def test_seed_figures_7b():
    """000_*.txt: 42 GFLOPs/token, 1680 TFLOPs per 40k tokens, 86 s at A100 fp32 vs 5.4 s at fp16,
    28 GB of fp32 weights vs 14 GB in fp16 (decimal GB)."""
    per_token = flops_per_token(7e9)
    assert per_token == pytest.approx(42e9)
    batch = per_token * 40_000
    assert batch == pytest.approx(1680e12)
    a100 = lookup_gpu("A100-80GB")
    assert seconds_at(batch, a100.peak_flops("fp32")) == pytest.approx(86, abs=0.5)
    assert seconds_at(batch, a100.peak_flops("fp16")) == pytest.approx(5.4, abs=0.05)
    assert weights_gb(7e9, 4) == pytest.approx(28) and weights_gb(7e9, 2) == pytest.approx(14)


@pytest.mark.parametrize("name", list(PRESETS))
def test_flops_match_the_models_own_count(name):
    desc = describe_model(name)
    assert model_flops_per_token(desc, 1024) == pytest.approx(training_flops_per_token(PRESETS[name], 1024))


def test_step_compute_uses_the_regimes_peak_and_mfu():
    desc, a100 = describe_model("7b"), lookup_gpu("A100-80GB")
    fp32 = step_compute(desc, precision="fp32", seq_len=2048, tokens_per_step=40_000, gpu=a100, mfu=0.5)
    bf16 = step_compute(desc, precision="bf16-mixed", seq_len=2048, tokens_per_step=40_000, gpu=a100, mfu=0.5)
    assert fp32.step_s_at_peak / bf16.step_s_at_peak == pytest.approx(312 / 19.5)
    assert fp32.step_s_at_mfu == pytest.approx(2 * fp32.step_s_at_peak)
    assert bf16.tokens_per_s == pytest.approx(40_000 / bf16.step_s_at_mfu)
    ckpt = step_compute(
        desc, precision="bf16-mixed", seq_len=2048, tokens_per_step=40_000, gpu=a100, mfu=0.5, checkpointing=True
    )
    assert ckpt.step_s_at_peak == pytest.approx(bf16.step_s_at_peak * 8 / 6)
    v100 = step_compute(
        desc, precision="bf16-mixed", seq_len=2048, tokens_per_step=1, gpu=lookup_gpu("V100-32GB"), mfu=1
    )
    assert v100.peak_flops is None and v100.step_s_at_peak is None  # no bf16 path on Volta


@pytest.mark.parametrize(
    "text,expected",
    [("24GiB", 24 * GIB), ("80 GB", 80 * 1000**3), ("16384MiB", 16 * GIB), ("1.5TiB", 1536 * GIB), ("40", 40 * GIB)],
)
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "12XB", "0GiB", "-3GB"])
def test_parse_memory_refuses(text):
    with pytest.raises(UsageError):
        parse_memory(text)


def test_targets():
    a100 = resolve_target("a100-80gb", None)
    assert a100.name == "A100-80GB" and a100.capacity_bytes == int(80 * GIB * 0.99)
    with pytest.raises(UsageError, match="several variants: A100-40GB, A100-80GB"):
        resolve_target("a100", None)  # once silently the 80GB card
    custom = resolve_target("A100-80GB", "40GiB")
    assert custom.capacity_bytes == 40 * GIB and custom.gpu.name == "A100-80GB"
    assert resolve_target(None, None) is None
    with pytest.raises(UsageError, match="known GPUs: V100-16GB"):
        resolve_target("Z100", None)


@pytest.mark.parametrize("field", ["micro_batch", "seq_len"])
def test_largest_is_the_boundary(field):
    desc = describe_model("7b")
    setting = StepSetting(precision="bf16-true", checkpointing="full", micro_batch=1, seq_len=2048)
    capacity = resolve_target("A100-80GB", None).capacity_bytes
    best = largest(desc, setting, capacity, field=field)
    assert best > 1
    assert analytic_ledger(desc, replace(setting, **{field: best})).total <= capacity
    assert analytic_ledger(desc, replace(setting, **{field: best + 1})).total > capacity


def test_largest_is_zero_when_nothing_fits():
    desc = describe_model("70b")
    assert largest(desc, StepSetting(precision="fp32"), 80 * GIB, field="micro_batch") == 0


def test_cheapest_fix_fits_and_follows_the_cost_order():
    desc = describe_model("7b")
    capacity = resolve_target("A100-80GB", None).capacity_bytes
    setting = StepSetting(precision="bf16-mixed", micro_batch=8, seq_len=2048)
    fix = cheapest_fix(desc, setting, capacity, gpu=lookup_gpu("A100-80GB"))
    assert fix is not None and fix.total_bytes <= capacity
    assert analytic_ledger(desc, fix.setting).total == fix.total_bytes
    # 16 B/param of weights, grads and Adam states (~100 GiB) cannot fit by batch or checkpointing alone
    assert fix.setting.optimizer == "adamw-8bit" or fix.setting.precision == "bf16-true"
    assert fix.setting.micro_batch * fix.setting.grad_accum >= 8  # tokens per step kept
    fitting = replace(setting, optimizer="adamw-8bit", micro_batch=1)
    assert cheapest_fix(desc, fitting, capacity, gpu=None) is None


def test_accumulation_is_tried_first():
    desc = describe_model("1b")
    capacity = resolve_target("A100-80GB", None).capacity_bytes
    setting = StepSetting(precision="bf16-mixed", micro_batch=64, seq_len=2048)
    fix = cheapest_fix(desc, setting, capacity, gpu=None)
    assert "accumulation" in fix.change and fix.setting.checkpointing == "none"
    assert fix.setting.grad_accum > 1 and fix.setting.micro_batch < 64


def test_base_precision_per_gpu():
    assert base_precision(lookup_gpu("T4"))[0] == "fp16-mixed"
    assert base_precision(lookup_gpu("V100-32GB"))[0] == "fp16-mixed"
    assert base_precision(lookup_gpu("A100-80GB"))[0] == "bf16-mixed"
    assert base_precision(None)[0] == "bf16-mixed"


def _plan_compute(gpu: str, precision: str, **config) -> dict:
    from ampkit.plan.config import PlanConfig
    from ampkit.plan.planner import build_plan

    summary = build_plan(
        PlanConfig(model="gpt2-124m", gpu=gpu, precisions=precision, activation_checkpointing="none", **config)
    )
    return summary["rows"][0]["compute"]


def test_plan_step_time_per_precision_from_the_achievable_mfu_table():
    """No --mfu: bf16 and fp8 on an H100 at torchtitan's measured MFU (their step-time ratio is the
    table's, not the datasheet's 2x); fp32 (no row) at bf16's row's MFU: the datasheet's 14.8x ratio to
    bf16, which its note says, not a ratio made up from an assumed MFU."""
    from ampkit.hardware.mfu import achievable_mfu

    h100 = lookup_gpu("H100-80GB")
    bf16, fp32 = _plan_compute("H100-80GB", "bf16-mixed"), _plan_compute("H100-80GB", "fp32")
    fp8 = _plan_compute("H100-80GB", "fp8")
    row, row8 = achievable_mfu("H100-80GB", "bf16"), achievable_mfu("H100-80GB", "fp8")
    assert bf16["mfu_source"] == "table" and bf16["mfu"] == pytest.approx(row.mfu)
    assert row.source in bf16["mfu_note"]
    assert fp8["mfu_source"] == "table" and fp8["mfu"] == pytest.approx(row8.mfu) and row8.mfu < row.mfu
    assert fp32["mfu_source"] == "datasheet" and fp32["mfu"] == pytest.approx(row.mfu)
    assert "datasheet ratio" in fp32["mfu_note"] and "bf16 row" in fp32["mfu_note"]
    ratio = fp32["step_s_at_mfu"] / bf16["step_s_at_mfu"]
    assert ratio == pytest.approx(h100.peak_flops("bf16") / h100.peak_flops("fp32"))


def test_an_explicit_mfu_wins_and_a_gpu_without_a_row_says_datasheet():
    given = _plan_compute("H100-80GB", "bf16-mixed", mfu=0.5)
    assert (given["mfu"], given["mfu_source"], given["mfu_note"]) == (0.5, "--mfu", None)
    h200 = _plan_compute("H200", "bf16-mixed")
    assert h200["mfu_source"] == "datasheet" and "no achievable-MFU row for H200 bf16" in h200["mfu_note"]


def test_plans_output_says_datasheet_for_a_gpu_without_a_row(tmp_path, capsys, monkeypatch):
    from ampkit.cli import main

    monkeypatch.setenv("COLUMNS", "80")
    argv = ["plan", "--model", "tiny", "--gpu", "H200", "--precisions", "bf16-mixed", "--activation-checkpointing"]
    assert main([*argv, "none", "--out", str(tmp_path / "h200")]) == 0
    out = capsys.readouterr().out
    assert "MFU per GPU and precision" in out and "datasheet ratio: no achievable-MFU row for H200 bf16" in out
    assert main([*argv, "none", "--mfu", "0.5", "--out", str(tmp_path / "given")]) == 0
    out = capsys.readouterr().out
    assert "MFU 0.5" in out and "datasheet" not in out
