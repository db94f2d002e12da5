"""Gradient statistics: the fp16 underflow/overflow forecast against what a cast really does."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ampkit.diagnostics import GradientStatistics, flush_fraction, long_tail, loss_scale_range
from ampkit.diagnostics.fp16 import FP16_FLUSH_AT, FP16_MIN_NORMAL
from ampkit.diagnostics.gradstats import layer_of


def _known_gradients(n: int = 20000, seed: int = 0) -> torch.Tensor:
    """|g| log-uniform over 2^-60 .. 2^4, random signs, some exact zeros, and values exactly on the
    rounding boundaries (2^-25 and just above it) at scale 1."""
    gen = torch.Generator().manual_seed(seed)
    exponents = torch.rand(n, generator=gen) * 64 - 60
    signs = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    g = signs * torch.pow(2.0, exponents)
    g[:50] = 0.0
    g[50:60] = FP16_FLUSH_AT  # ties to the even 0
    g[60:70] = torch.nextafter(torch.tensor(FP16_FLUSH_AT), torch.tensor(1.0))  # rounds up to 2^-24
    return g


def _ground_truth_flushed(g: torch.Tensor, scale: float) -> float:
    scaled = g * scale
    return ((scaled.to(torch.float16) == 0) & (scaled != 0)).float().mean().item()


@pytest.mark.parametrize("scale", [1.0, 2.0**10, 2.0**16, 3.0, 1000.0])
def test_flush_forecast_equals_cast_ground_truth(scale):
    g = _known_gradients()
    predicted = flush_fraction(g, scale)
    assert predicted == _ground_truth_flushed(g, scale)
    assert 0.0 < predicted < 1.0  # the data straddles the boundary at every scale tried


def test_collector_forecast_matches_ground_truth_and_norms():
    """The training-time path: hooks see the scaled gradients, statistics come back at drain()."""
    target = _known_gradients(4096).reshape(64, 64)
    layer = nn.Linear(64, 64, bias=False)
    scale = 2.0**12
    stats = GradientStatistics(layer, every=1, scale_fn=lambda: scale).attach()
    stats.begin_step(1)
    (layer.weight * target).sum().mul(scale).backward()  # d/dw = target * scale, as a scaled loss gives
    assert len(stats.pending) == 1 and stats.pending[0][3].device == target.device  # still on device
    [step] = stats.drain()
    stats.detach()
    [tensor] = step.tensors
    assert tensor.flush_fraction == _ground_truth_flushed(target, scale)
    scaled = (target * scale).abs()
    assert tensor.subnormal_fraction == pytest.approx(
        ((scaled > FP16_FLUSH_AT) & (scaled < FP16_MIN_NORMAL)).float().mean().item()
    )
    assert tensor.norm == pytest.approx(target.norm().item(), rel=1e-6)
    assert tensor.max_abs == pytest.approx(target.abs().max().item(), rel=1e-6)
    assert tensor.headroom == pytest.approx(65504 / (target.abs().max().item() * scale), rel=1e-6)
    assert stats.drain() == []


def test_collector_arms_every_n_steps_and_after_the_last_micro_batch():
    layer = nn.Linear(8, 8, bias=False)
    stats = GradientStatistics(layer, every=2, micro_batches=2).attach()
    for step in (1, 2, 3, 4):
        stats.begin_step(step)
        for _ in range(2):
            layer(torch.ones(1, 8)).sum().backward()
        layer.zero_grad(set_to_none=True)
    drained = stats.drain()
    assert [s.step for s in drained] == [2, 4]
    # accumulated over both micro-batches: d/dW of sum(W @ 1) is 1 per element, twice
    assert drained[0].tensors[0].max_abs == pytest.approx(2.0)


def test_scale_range_bounds_hold_under_real_casts():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(5000, generator=gen) * 1e-6, torch.randn(300, generator=gen) * 1e-2]
    tol = 1e-3
    rng = loss_scale_range(grads, flush_tolerance=tol)
    flat = torch.cat(grads)
    assert rng.representable and rng.low_pow2 <= rng.high_pow2
    assert _ground_truth_flushed(flat, rng.low_pow2) <= tol < _ground_truth_flushed(flat, rng.low_pow2 / 2)
    assert torch.isfinite((flat * rng.high_pow2).to(torch.float16)).all()
    assert not torch.isfinite((flat * rng.high * 1.01).to(torch.float16)).all()


def test_scale_range_reports_gradients_wider_than_fp16():
    g = torch.cat([torch.full((1000,), 1e-12), torch.tensor([1e3])])
    rng = loss_scale_range([g], flush_tolerance=1e-3)
    assert not rng.representable and rng.low_pow2 > rng.high_pow2


def test_long_tail_flags_the_towering_layer_only():
    norms = {"embed": 0.1, "blocks.0": 0.2, "blocks.1": 0.15, "blocks.2": 80.0, "norm": 0.12}
    tail = long_tail(norms)
    assert tail is not None and tail.layer == "blocks.2" and tail.ratio > 100
    assert long_tail({"a": 1.0, "b": 2.0, "c": 3.0, "d": math.nan}) is None


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("blocks.3.attn.q_proj.weight", "blocks.3"),
        ("embed.weight", "embed"),
        ("lm_head.weight", "lm_head"),
        ("scale", "scale"),
    ],
)
def test_layer_of(name, layer):
    assert layer_of(name) == layer
