"""ampkit.distributed.settings: which train settings can run data-parallel (config-time checks)."""

from __future__ import annotations

import pytest

from ampkit.distributed.settings import (
    PARALLEL_MODES,
    check_inject_rank,
    check_parallel_settings,
    check_single_process,
    known_world_size,
)
from ampkit.errors import UsageError
from ampkit.sections import GuardSection


def _check(**overrides) -> None:
    check_parallel_settings(
        **{"parallel": "ddp", "reduce_dtype": "fp32", "nproc_per_node": 2, "nnodes": 1, **overrides}
    )


@pytest.mark.parametrize("parallel", PARALLEL_MODES)
def test_plain_settings_pass(parallel):
    _check(parallel=parallel, nproc_per_node=0 if parallel == "none" else 2)
    check_single_process(parallel, GuardSection().single_process_parts(parallel))  # the default guard: nothing on


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


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_the_safety_net_runs_data_parallel(mode):
    net = GuardSection(guard=True, detect_nonfinite=True, inject="blocks.0.mlp:forward:nan", inject_rank=1)
    check_single_process(mode, net.single_process_parts(mode))


def test_gradient_meters_need_whole_gradients():
    with pytest.raises(UsageError, match="--grad-stats-every reads whole gradients and weights, which --parallel fsdp"):
        check_single_process("fsdp", GuardSection(grad_stats_every=5).single_process_parts("fsdp"))
    check_single_process("ddp", GuardSection(grad_stats_every=5).single_process_parts("ddp"))  # rank 0's


@pytest.mark.parametrize(
    ("rank", "inject", "world", "message"),
    [
        (2, "blocks.0:backward:inf", 2, r"--inject-rank 2 is past the job's 2 rank\(s\) \(0..1\)"),
        (1, "blocks.0:backward:inf", 1, r"--inject-rank 1 is past the job's 1 rank\(s\)"),
        (0, "", 2, "add --inject module:phase:kind"),
    ],
)
def test_a_fault_rank_the_job_lacks_is_refused(rank, inject, world, message):
    with pytest.raises(UsageError, match=message) as err:
        check_inject_rank(rank, inject=inject, world_size=world)
    assert "\n" not in str(err.value)


def test_a_fault_rank_is_checked_once_the_world_is_known():
    check_inject_rank(5, inject="blocks.0:backward:inf", world_size=None)  # torchrun's: checked after joining
    check_inject_rank(-1, inject="blocks.0:backward:inf", world_size=1)  # every rank
    assert known_world_size(parallel="ddp", nproc_per_node=2, nnodes=2) == 4
    assert known_world_size(parallel="fsdp", nproc_per_node=0, nnodes=1) is None
    assert known_world_size(parallel="none", nproc_per_node=0, nnodes=1) == 1
