"""The range audit's backward side and its target format: |gradient| x the initial loss scale per module
against the diagnosed precision's format, the init scale that fits (checked against a real fp16-mixed
step: it steps at that scale and skips at twice it), the target read from the format registry per
precision, and the model's gradients left as they were."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ampkit.core import policy_loss
from ampkit.diagnostics.advice import Evidence, rule_scaled_grads
from ampkit.diagnostics.range_audit import run_range_audit
from ampkit.diagnostics.range_grads import fitting_scale, scale_fix
from ampkit.diagnostics.range_report import range_rows
from ampkit.diagnostics.range_target import precision_target
from ampkit.precision import ScalerConfig, build_precision

GAIN = 50.0  # d loss / d output per element: x 65536 is far over fp16's 65504


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))


def _loss(model: nn.Module, batch: torch.Tensor):
    return (model(batch) * GAIN).sum(), batch.shape[0]


def _batch() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def _audit(model: nn.Module, precision: str, scale: float | None):
    fp32 = build_precision("fp32", device_type="cpu")
    target = precision_target(precision, loss_scale=scale)
    return run_range_audit(model, [_batch()], policy=fp32, loss_fn=_loss, target=target)


def _fp16_steps(model: nn.Module, init_scale: float) -> bool:
    """One real fp16-mixed step at `init_scale`: whether the scaler let it step (no inf in the backward)."""
    policy = build_precision("fp16-mixed", device_type="cpu", scaler=ScalerConfig(init_scale=init_scale))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with policy.run_context():
        loss, _ = policy_loss(policy, _loss, model, _batch())
        policy.backward(loss)
        policy.unscale_gradients(optimizer)
        stepped = policy.optimizer_step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return stepped


def test_scaled_gradients_are_measured_and_the_fitting_scale_is_the_one_fp16_steps_at():
    model = _model()
    hidden: list[torch.Tensor] = []

    def keep(module, args, out):
        out.retain_grad()
        hidden.append(out)

    model[1].register_forward_hook(keep)
    loss, _ = _loss(model, _batch())
    loss.backward()  # the reference gradients, by autograd itself
    expected_w2 = max(p.grad.abs().max().item() for p in model[2].parameters())  # its bias: 4 rows x GAIN
    expected_gelu = hidden[0].grad.abs().max().item()
    model.zero_grad(set_to_none=True)

    audit = _audit(model, "fp16-mixed", 65536.0)
    by_name = {m.name: m for m in audit.modules}
    assert audit.format == "fp16" and audit.loss_scale == 65536.0
    assert by_name["2"].weight_grad_max == pytest.approx(expected_w2)
    assert by_name["1"].output_grad_max == pytest.approx(expected_gelu)
    assert by_name["2"].grad_scaled_max == pytest.approx(65536.0 * max(expected_w2, by_name["2"].output_grad_max))
    assert audit.grad_max == pytest.approx(
        max(g for m in audit.modules for g in (m.output_grad_max or 0, m.weight_grad_max or 0))
    )
    flagged = {o.module for o in audit.grad_overflows}
    assert "2" in flagged and all(o.scaled_max > 65504 and o.headroom_bits < 0 for o in audit.grad_overflows)
    s = audit.fitting_scale
    assert s == 2.0 ** round(math.log2(s)) and audit.grad_max * s <= 65504 < audit.grad_max * 2 * s
    # the forecast against the real thing: fp16-mixed's scaler steps at the fitting scale, skips above it
    assert _fp16_steps(model, 65536.0) is False
    assert _fp16_steps(model, s) is True and _fp16_steps(model, 2 * s) is False
    assert all(p.grad is None for p in model.parameters())  # the audit left the gradients as they were


def test_the_advice_names_the_modules_and_the_init_scale_that_fits():
    audit = _audit(_model(), "fp16-mixed", 65536.0)
    facts = dict(loss_scaling=True, device_type="cpu", native_bf16=False, init_scale=65536.0, clip_grad_norm=1.0)
    advice = rule_scaled_grads(Evidence(precision="fp16-mixed", compute_dtype="float16", range_audit=audit, **facts))
    assert advice is not None and advice.rule == "scaled_grads_overflow" and advice.severity == "warn"
    fits = f"{audit.fitting_scale:g}"
    assert f"--init-scale {fits}" in advice.fix and advice.title.startswith(
        "Gradients x loss scale 65536 overflow fp16"
    )
    assert (
        advice.evidence[0].startswith(f"{audit.grad_overflows[0].module}: ")
        and "> fp16's max 65504" in advice.evidence[0]
    )
    (_, (label, value)) = range_rows(audit.to_dict())
    assert label == "grads x loss scale 65536 (fp16)" and value.endswith(f"init scale <= {fits} fits")
    # the same gradients at a scale that fits: nothing to say
    calm = _audit(_model(), "fp16-mixed", audit.fitting_scale)
    assert (
        calm.grad_overflows == []
        and rule_scaled_grads(Evidence(precision="fp16-mixed", compute_dtype="float16", range_audit=calm, **facts))
        is None
    )


@pytest.mark.parametrize(
    ("precision", "fmt", "dtype"),
    [
        ("fp16-mixed", "fp16", torch.float16),
        ("fp16-true", "fp16", torch.float16),
        ("bf16-mixed", "bf16", torch.bfloat16),
        ("bf16-true", "bf16", torch.bfloat16),
        ("fp8-emulated", "bf16", torch.bfloat16),
        ("mxfp4-emulated", "bf16", torch.bfloat16),
        ("fp32", "fp32", torch.float32),
        ("tf32", "fp32", torch.float32),
    ],
)
def test_the_target_is_the_precisions_compute_format_from_the_registry(precision, fmt, dtype):
    target = precision_target(precision)
    info = torch.finfo(dtype)
    assert (target.format, target.max, target.smallest_normal) == (fmt, info.max, info.smallest_normal)
    assert target.smallest_subnormal == info.smallest_normal * info.eps and target.loss_scale == 1.0
    assert target.unbounded is (fmt == "fp32")
    assert ("scaled per tensor or block" in target.note) is precision.endswith("-emulated")


def test_under_bf16_and_fp32_the_same_gradients_are_not_flagged():
    for precision in ("bf16-mixed", "fp32"):
        audit = _audit(_model(), precision, None)
        assert audit.grad_overflows == [] and audit.loss_scale == 1.0 and audit.grad_max is not None


def test_the_forward_only_audit_leaves_the_gradient_fields_empty():
    fp32 = build_precision("fp32", device_type="cpu")
    audit = run_range_audit(_model(), [_batch()], policy=fp32, loss_fn=_loss, gradients=False)
    assert audit.grad_max is None and audit.fitting_scale is None and audit.grad_overflows == []
    assert all(m.grad_scaled_max is None for m in audit.modules) and range_rows(audit.to_dict())[1:] == []


def test_when_true_scale_gradients_overflow_no_loss_scale_fits():
    target = precision_target("fp16-mixed", loss_scale=65536.0)
    assert fitting_scale(1e5, target) == 0.5 and fitting_scale(None, target) is None
    assert scale_fix(0.5, target).startswith("no loss scale fits") and "--init-scale" not in scale_fix(0.5, target)
    assert "--init-scale 1024" in scale_fix(fitting_scale(50.0, target), target)  # 65504 / 50 = 1310: 2^10
