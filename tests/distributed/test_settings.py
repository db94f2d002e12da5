"""ampkit.distributed.settings: which train settings can run data-parallel (config-time checks)."""

from __future__ import annotations

import pytest

from ampkit.distributed.settings import PARALLEL_MODES, check_parallel_settings, check_single_process
from ampkit.errors import UsageError
from ampkit.sections import GuardSection


def _check(**overrides) -> None:
    check_parallel_settings(
        **{"parallel": "ddp", "reduce_dtype": "fp32", "nproc_per_node": 2, "nnodes": 1, **overrides}
    )


@pytest.mark.parametrize("parallel", PARALLEL_MODES)
def test_plain_settings_pass(parallel):
    _check(parallel=parallel, nproc_per_node=0 if parallel == "none" else 2)
    check_single_process(parallel, GuardSection().single_process_parts())  # the default guard: nothing on


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"parallel": "tp"}, "unknown --parallel 'tp'"),
        ({"reduce_dtype": "fp16"}, "unknown --reduce-dtype 'fp16'"),
        ({"nproc_per_node": -1}, "--nproc-per-node must be >= 0"),
        ({"nnodes": 0}, "--nnodes must be >= 1"),
        ({"parallel": "none", "nproc_per_node": 2}, "add --parallel ddp or --parallel fsdp"),
    ],
)
def test_settings_that_cannot_run_name_the_fix(overrides, message):
    with pytest.raises(UsageError, match=message):
        _check(**overrides)


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        ({"guard": True}, "the NaN guard's rollback runs in a single process only"),
        ({"inject": "blocks.0.mlp:forward:nan"}, "--inject runs in a single process only"),
        ({"detect_nonfinite": True}, "--detect-nonfinite runs in a single process only"),
        ({"grad_stats_every": 5}, "--grad-stats-every runs in a single process only"),
    ],
)
def test_single_process_diagnostics_cannot_run_data_parallel(guard, message):
    with pytest.raises(UsageError, match=message):
        check_single_process("fsdp", GuardSection(**guard).single_process_parts())


def test_single_process_diagnostics_are_allowed_without_parallelism():
    parts = GuardSection(guard=True, detect_nonfinite=True, grad_stats_every=5).single_process_parts()
    assert len(parts) == 3
    check_single_process("none", parts)
