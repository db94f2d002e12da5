"""ampkit.plan.overrides: the per-module precision overrides in plan's ledger and the fit check."""

from __future__ import annotations

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.models import build_model, get_preset
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.fit_check import estimate_fit
from ampkit.plan.overrides import kept_parameters, weights_delta
from ampkit.plan.planner import build_plan
from ampkit.plan.setting import StepSetting
from ampkit.precision import ModuleOverrides


def _parameters(summary) -> dict[str, int]:
    return {r["setting"]["precision"]: r["ledger"]["lines_at_peak_bytes"]["parameters"] for r in summary["rows"]}


def test_fp32_kept_weights_cost_their_fp32_bytes_in_a_bf16_true_plan():
    common = {"model": "small", "precisions": "bf16-true,bf16-mixed", "activation_checkpointing": "none"}
    plain = _parameters(build_plan(PlanConfig(**common)))
    kept = build_plan(PlanConfig(**common, keep_fp32="blocks.*.mlp"))
    model = build_model(get_preset("small"), device="meta")
    mlp = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks.") and ".mlp." in n)
    assert _parameters(kept)["bf16-true"] - plain["bf16-true"] == mlp * (4 - 2)  # fp32, not bf16
    assert _parameters(kept)["bf16-mixed"] == plain["bf16-mixed"]  # mixed weights are fp32 already
    [row] = [r for r in kept["rows"] if r["setting"]["precision"] == "bf16-true"]
    assert row["module_precision"]["parameters"] == {"float32": mlp}


def test_a_plan_pattern_matching_no_module_is_one_line():
    with pytest.raises(UsageError, match=r"'blocks.\*.nope' matches no module"):
        build_plan(PlanConfig(model="tiny", precisions="bf16-true", keep_fp32="blocks.*.nope"))


def test_the_fit_check_counts_the_kept_weights():
    desc = describe_model("tiny")
    overrides = ModuleOverrides.parse("blocks.0=fp32,lm_head=bf16-true")
    kept = kept_parameters(desc, overrides)
    model = build_model(get_preset("tiny"), device="meta")
    assert kept[torch.float32] == sum(p.numel() for p in model.blocks[0].parameters())
    assert kept[torch.bfloat16] == model.lm_head.weight.numel()
    setting = StepSetting(precision="fp16-true", micro_batch=2, seq_len=32)
    plain = estimate_fit(desc, setting, torch.device("cpu"))
    counted = estimate_fit(desc, setting, torch.device("cpu"), kept=kept)
    if plain is None or counted is None:
        pytest.skip("this host reports no available memory")
    delta = weights_delta(kept, "fp16-true")
    assert delta == kept[torch.float32] * 2 and counted.needed_bytes - plain.needed_bytes == delta


def test_a_vlm_plan_counts_a_kept_part_in_fp32(tmp_path):
    pytest.importorskip("transformers")
    from vlm_fixtures import write_real_size

    spec = f"hf:{write_real_size(tmp_path / 'llava', 'LLaVA-1.5-7B')}"
    common = {"model": spec, "precisions": "bf16-true", "activation_checkpointing": "none"}
    parts = lambda s: {p["part"]: p for p in s["rows"][0]["parts"]}  # noqa: E731
    plain, kept = parts(build_plan(PlanConfig(**common))), parts(build_plan(PlanConfig(**common, keep_fp32="vision")))
    assert kept["vision"]["precision"] == "fp32" and kept["language"]["precision"] == "bf16-true"
    assert kept["vision"]["parameters"] == 2 * plain["vision"]["parameters"]
    assert kept["language"]["parameters"] == plain["language"]["parameters"]
    with pytest.raises(UsageError, match="counts overrides by part"):
        build_plan(PlanConfig(**common, keep_fp32="hf.model.vision_tower"))
