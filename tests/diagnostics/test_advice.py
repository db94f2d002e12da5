"""ampkit.diagnostics.advice: each rule maps doctor's evidence to one fix, fixes first."""

from __future__ import annotations

from ampkit.diagnostics.advice import Evidence, advise, attribute_path, fp32_fix_snippet
from ampkit.diagnostics.locator import Finding


def _finding(module: str = "blocks.1.mlp", site: str = "outputs", phase: str = "forward") -> Finding:
    return Finding(
        kind="nonfinite",
        module=module,
        cls="SwiGLU",
        phase=phase,
        site=site,
        step=3,
        values="inf",
        explanation="overflowed",
    )


def _evidence(**overrides) -> Evidence:
    base = dict(
        precision="fp16-mixed",
        compute_dtype="float16",
        loss_scaling=True,
        device_type="cuda",
        native_bf16=False,
        init_scale=65536.0,
        clip_grad_norm=1.0,
    )
    return Evidence(**{**base, **overrides})


def test_attribute_path_indexes_module_lists():
    assert attribute_path("blocks.1.mlp") == "model.blocks[1].mlp"
    assert attribute_path("lm_head") == "model.lm_head"


def test_an_fp16_overflow_is_fixed_by_keeping_its_module_in_fp32():
    (advice,) = advise(_evidence(nonfinite=_finding()))
    assert advice.rule == "keep_module_fp32" and advice.severity == "fix"
    assert advice.fix == fp32_fix_snippet("blocks.1.mlp", "cuda")
    assert "model.blocks[1].mlp(x.float())" in advice.fix and "--keep-fp32 blocks.1.mlp" in advice.fix


def test_a_bad_input_blames_the_parent_module():
    advice = advise(_evidence(nonfinite=_finding(module="blocks.1.mlp.down_proj", site="inputs")))
    assert advice[0].title.startswith("Keep blocks.1.mlp in fp32")


def test_non_finite_in_fp32_is_not_a_precision_problem():
    (advice,) = advise(_evidence(precision="fp32", compute_dtype="float32", loss_scaling=False, nonfinite=_finding()))
    assert advice.rule == "not_a_precision_problem"


def test_early_overflow_skips_lower_the_initial_scale():
    scale = {"active": True, "early_skipped": 3, "initial": 65536.0, "min": 8192.0}
    (advice,) = advise(_evidence(scale=scale))
    assert advice.rule == "lower_init_scale" and advice.fix.startswith("--init-scale 4096")


def test_fixes_come_before_warnings_and_a_healthy_run_says_so():
    trouble = advise(_evidence(native_bf16=True, nonfinite=_finding(), scale={"skipped": 0}))
    assert [a.severity for a in trouble] == ["fix", "warn"]  # keep fp32, then "bf16 is native here"
    (healthy,) = advise(_evidence(precision="bf16-mixed", compute_dtype="bfloat16", loss_scaling=False))
    assert healthy.rule == "healthy" and healthy.severity == "info"
    assert healthy.to_dict()["fix"] == "nothing to do"
