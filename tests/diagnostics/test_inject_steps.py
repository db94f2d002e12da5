"""ampkit.diagnostics.inject: the steps a fault is active in, and how a spec reads back."""

from __future__ import annotations

import pytest
from torch import nn

from ampkit.diagnostics.inject import FaultSpec, parse_fault_spec, resolve_module
from ampkit.errors import UsageError


@pytest.mark.parametrize(
    ("text", "active_steps"),
    [
        ("blocks.0.mlp:forward:nan", [1, 2, 3, 4, 5]),
        ("blocks.0.mlp:forward:nan@3", [3]),
        ("blocks.0.mlp:backward:inf@2-4", [2, 3, 4]),
    ],
)
def test_a_fault_is_active_exactly_in_its_steps(text, active_steps):
    spec = parse_fault_spec(text)
    assert [step for step in range(1, 6) if spec.active(step)] == active_steps
    assert str(spec) == text


def test_a_range_needs_both_ends_in_order():
    with pytest.raises(UsageError, match="not a range of steps"):
        FaultSpec(module="blocks.0", phase="forward", kind="nan", first_step=4, last_step=2)
    with pytest.raises(UsageError, match="not a range of steps"):
        FaultSpec(module="blocks.0", phase="forward", kind="nan", first_step=2)


def test_resolve_module_follows_dotted_paths():
    model = nn.Sequential(nn.Sequential(nn.Linear(1, 1), nn.ReLU()))
    assert isinstance(resolve_module(model, "0.1"), nn.ReLU)
    with pytest.raises(UsageError):
        resolve_module(model, "0.7")
