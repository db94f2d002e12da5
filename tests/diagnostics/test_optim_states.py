"""AdamW's eps against fp16 optimizer states: 1e-8 rounds to 0 in fp16 (smallest subnormal 5.96e-8), so
a real AdamW step computing in fp16 states divides by zero (NaN, inf) where fp32 states step cleanly;
ampkit's fused AdamW keeps eps but its fp16 v flushes below the |g| the hazard names; the advice
`adam_eps_fp16` fires exactly where the states are fp16."""

from __future__ import annotations

import pytest
import torch

from ampkit.core.optim import ADAMW_BETAS, ADAMW_EPS, build_optimizer
from ampkit.diagnostics.advice import Evidence, rule_adam_eps_fp16
from ampkit.diagnostics.optim_states import SAFE_EPS, adam_eps_hazard
from ampkit.formats import get_format

GRADS = [0.0, 1e-5, 1e-4, 1e-1]  # a zero gradient, two whose v flushes in fp16, one that fits


def _step(dtype: torch.dtype, eps: float) -> torch.Tensor:
    """One step of torch's AdamW on its single-tensor path (it computes in the states' dtype)."""
    p = torch.nn.Parameter(torch.zeros(len(GRADS), dtype=dtype))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=ADAMW_BETAS, eps=eps, weight_decay=0.0, foreach=False)
    p.grad = torch.tensor(GRADS, dtype=dtype)
    opt.step()
    return p.detach().float()


def test_the_eps_rounds_to_zero_in_fp16_and_a_real_step_divides_by_it():
    info = get_format("fp16").finfo
    hazard = adam_eps_hazard("fp16-true")
    assert hazard is not None and hazard.eps == ADAMW_EPS and hazard.state_format == "fp16"
    assert hazard.smallest_subnormal == info.smallest_normal * info.eps == 2.0**-24
    assert hazard.eps_stored == 0.0 == torch.tensor(ADAMW_EPS, dtype=torch.float16).item()
    fp16 = _step(torch.float16, ADAMW_EPS)
    assert torch.isnan(fp16[0]) and torch.isinf(fp16[1:3]).all()  # 0/0 and m/0: the eps is gone
    assert torch.isfinite(_step(torch.float32, ADAMW_EPS)).all()  # fp32 states: the same step is clean
    assert torch.isfinite(_step(torch.float16, SAFE_EPS)).all()  # the advised eps in fp16: clean too


def test_fused_adamw_keeps_eps_but_its_fp16_v_flushes_below_the_named_gradient():
    hazard = adam_eps_hazard("fp16-true")
    assert hazard is not None
    for factor, flushed in ((0.9, True), (1.1, False)):
        model = torch.nn.Linear(2, 1, bias=False).half()
        opt = build_optimizer(model, name="adamw", lr=1e-3, weight_decay=0.0)  # ampkit's: torch's fused AdamW
        model.weight.grad = torch.full_like(model.weight, factor * hazard.flush_grad)
        opt.step()
        assert torch.isfinite(model.weight).all()
        assert bool((opt.state[model.weight]["exp_avg_sq"] == 0).all()) is flushed


@pytest.mark.parametrize(("precision", "fires"), [("fp16-true", True), ("fp16-mixed", False), ("bf16-true", False)])
def test_the_advice_fires_where_the_states_are_fp16(precision, fires):
    facts = dict(loss_scaling=False, device_type="cpu", native_bf16=False, init_scale=65536.0, clip_grad_norm=1.0)
    advice = rule_adam_eps_fp16(Evidence(precision=precision, compute_dtype="float16", **facts))
    assert (advice is not None) is fires
    if advice is not None:
        assert advice.rule == "adam_eps_fp16" and advice.severity == "warn"
        assert "1e-08" in advice.title and "5.96e-08" in advice.title and "fp16-mixed" in advice.fix
        assert f"eps >= {SAFE_EPS:g}" in advice.fix and advice.evidence[0] == "eps 1e-08 stored in fp16 is 0"


@pytest.mark.parametrize(
    ("precision", "optimizer", "warns"),
    [("fp16-true", "adamw", True), ("fp16-mixed", "adamw", False), ("fp16-true", "sgd", False)],
)
def test_train_warns_before_building_where_the_states_lose_eps(precision, optimizer, warns):
    from ampkit.train.build import check_device
    from ampkit.train.config import TrainConfig

    _, _, warnings = check_device(TrainConfig.of(precision=precision, optimizer=optimizer, device="cpu"))
    mine = [w for w in warnings if "eps" in w]
    assert bool(mine) is warns
    if mine:
        (line,) = mine
        assert line.startswith("fp16-true keeps adamw's states in fp16, where its eps 1e-08 is 0") and len(line) < 240
