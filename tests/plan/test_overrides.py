"""ampkit.plan.overrides: the per-module precision overrides in plan's ledger and the fit check."""

from __future__ import annotations

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.models import build_model, get_preset
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.fit_check import CPU_DYNAMIC_FACTOR, estimate_fit
from ampkit.plan.overrides import kept_parameters, states_delta, weights_delta
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


def _lines(summary, precision) -> tuple[dict[str, int], dict[str, int]]:
    [row] = [r for r in summary["rows"] if r["setting"]["precision"] == precision]
    return row["ledger"]["lines_at_peak_bytes"], row["ledger"]["largest_bytes"]


@pytest.mark.parametrize(("optimizer", "state_bytes"), [("adamw", 2 * (4 - 2)), ("sgd", 4 - 2), ("adamw-8bit", 0)])
def test_fp32_kept_weights_bring_their_gradients_and_optimizer_states_in_fp32(optimizer, state_bytes):
    """Under bf16-true the states follow the weights' dtype (AdamW's two moments, SGD's momentum; 8-bit
    AdamW's do not), and so do the gradients: all of them where the line is largest."""
    common = {"model": "small", "precisions": "bf16-true", "activation_checkpointing": "none", "optimizer": optimizer}
    plain_peak, plain_largest = _lines(build_plan(PlanConfig(**common)), "bf16-true")
    kept_peak, kept_largest = _lines(build_plan(PlanConfig(**common, keep_fp32="blocks.*.mlp")), "bf16-true")
    model = build_model(get_preset("small"), device="meta")
    mlp = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks.") and ".mlp." in n)
    assert kept_peak["optimizer_states"] - plain_peak["optimizer_states"] == mlp * state_bytes
    assert kept_largest["gradients"] - plain_largest["gradients"] == mlp * (4 - 2)
    share = plain_peak["gradients"] / plain_largest["gradients"]
    assert kept_peak["gradients"] - plain_peak["gradients"] == int(mlp * (4 - 2) * share)


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
    states = states_delta(kept, setting)  # AdamW's two moments in fp32 for blocks.0; bf16 = fp16's bytes
    assert delta == kept[torch.float32] * 2 and states == kept[torch.float32] * 2 * 2
    grown = counted.needed_bytes - plain.needed_bytes  # + the gradients alive at the peak, as activations are
    assert delta + states <= grown <= delta + states + int(CPU_DYNAMIC_FACTOR * delta) + 1


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
