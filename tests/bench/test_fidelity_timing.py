"""Fidelity captures and comparisons, and the step-time statistics."""

from __future__ import annotations

import math

import pytest
import torch

from ampkit.bench.fidelity import capture_fidelity, compare_fidelity, cosine, fixed_batch, loss_curve_gap, verdict
from ampkit.bench.timing import summarize_steps
from ampkit.data import collate_pad
from ampkit.models import build_model, get_preset
from ampkit.precision import build_precision


def tiny_batch():
    gen = torch.Generator().manual_seed(1)
    units = [torch.randint(0, 256, (n,), generator=gen) for n in (33, 20)]  # one padded row
    return collate_pad(units)


def capture(precision: str) -> dict:
    model = build_model(get_preset("tiny"), seed=0)
    policy = build_precision(precision, device_type="cpu")
    model = policy.convert_module(model)
    return capture_fidelity(model=model, policy=policy, batch=tiny_batch())


def test_fp32_against_itself_is_exactly_one_and_zero():
    ref, again = capture("fp32"), capture("fp32")
    fid = compare_fidelity(ref, again)
    assert fid.logits_cosine == 1.0 and fid.grad_cosine == 1.0
    assert fid.logits_max_abs_diff == 0.0 and fid.loss_diff == 0.0
    assert fid.passed and fid.verdict == "healthy"
    assert ref["logits"].shape == (32 + 19, 256)  # real positions only: padding is left out


def test_bf16_mixed_differs_from_fp32_but_stays_healthy():
    fid = compare_fidelity(capture("fp32"), capture("bf16-mixed"))
    assert 0.99 < fid.logits_cosine < 1.0
    assert fid.logits_max_abs_diff > 0.0 and 0.9 < fid.grad_cosine < 1.0


def test_cosine_and_verdict_thresholds():
    v = torch.tensor([1.0, 2.0, 3.0])
    assert cosine(v, v) == 1.0
    assert cosine(v, -v) == -1.0
    assert math.isnan(cosine(v, torch.zeros(3)))
    assert [verdict(c) for c in (0.995, 0.95, 0.5, math.nan)] == ["healthy", "degraded", "amplified", "non-finite"]


def test_compare_refuses_captures_of_different_shapes():
    ref = capture("fp32")
    other = dict(ref, logits=ref["logits"][:-1])
    with pytest.raises(ValueError, match="differ in shape"):
        compare_fidelity(ref, other)


def test_fixed_batch_cuts_rows_and_recounts_tokens():
    batch = collate_pad([torch.arange(10), torch.arange(5), torch.arange(8)])
    cut = fixed_batch([batch], rows=2)
    assert cut.input_ids.shape == (2, 9) and cut.n_tokens == 9 + 4


def test_loss_curve_gap_over_common_steps():
    gap = loss_curve_gap([5.0, 4.0, 3.0], [5.0, 4.5])
    assert gap == {"steps_compared": 2, "max_gap": 0.5, "mean_gap": 0.25, "final_gap": 0.5}
    assert math.isnan(loss_curve_gap([5.0, 4.0], [5.0, math.nan])["max_gap"])


def test_a_stalled_step_is_left_out_of_items_per_s():
    step_s = [0.1] * 9 + [2.0]  # one step stalled 20x by something outside the process
    stats = summarize_steps(step_s, [1000] * 10, [1024] * 10)
    assert stats.stalled_steps == 1 and stats.measured_steps == 10
    assert stats.items_per_s == pytest.approx(9000 / 0.9)
    assert stats.items_per_s_all == pytest.approx(10000 / 2.9)
    assert stats.step_ms_median == pytest.approx(100.0) and stats.step_ms_max == pytest.approx(2000.0)


def test_a_long_batch_is_not_a_stall():
    # 4x the slots in 4.5x the time: slower per step, but not per slot
    stats = summarize_steps([0.1] * 9 + [0.45], [1000] * 9 + [4000], [1024] * 9 + [4096])
    assert stats.stalled_steps == 0
    assert stats.items_per_s == pytest.approx(13000 / 1.35)
    assert stats.step_ms_p10 == pytest.approx(100.0) and stats.step_ms_p90 == pytest.approx(135.0)


def test_speedup_compares_only_the_steps_both_ran():
    from ampkit.bench.summary import common_speedup

    # fp32's later batches are twice as long (more tokens, twice the time): its overall tokens/s is the
    # same, but a precision that only ran the first 3 short batches must be compared on those alone
    ref = {"step_s": [0.1] * 3 + [0.2] * 7, "tokens": [500] * 3 + [1000] * 7, "slots": [512] * 3 + [1024] * 7}
    slow = {"step_s": [0.4] * 3, "tokens": [500] * 3, "slots": [512] * 3}
    speedup, steps = common_speedup(slow, ref)
    assert steps == 3 and speedup == pytest.approx(0.25)
