"""ampkit.core.schedule: linear warmup, then cosine decay to min_lr_ratio of the peak."""

from __future__ import annotations

import itertools

import pytest
import torch

from ampkit.core.schedule import build_scheduler, lr_factor


def test_warmup_is_linear_and_decay_ends_at_the_floor():
    factors = [lr_factor(s, warmup_steps=4, total_steps=12, min_lr_ratio=0.1) for s in range(14)]
    assert factors[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factors[4] == pytest.approx(1.0)  # cosine starts at the peak
    assert factors[8] == pytest.approx(0.55)  # halfway: midway between peak and floor
    assert factors[12] == pytest.approx(0.1) and factors[13] == pytest.approx(0.1)  # held at the floor
    assert all(a >= b for a, b in itertools.pairwise(factors[4:]))


def test_scheduler_sets_the_optimizer_lr_step_by_step():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=2.0)
    scheduler = build_scheduler(optimizer, warmup_steps=2, total_steps=4, min_lr_ratio=0.0)
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([1.0, 2.0, 2.0, 1.0, 0.0])
