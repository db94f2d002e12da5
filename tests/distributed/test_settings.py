"""ampkit.distributed.settings: which train settings can run data-parallel (config-time checks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ampkit.distributed.settings import PARALLEL_MODES, check_parallel_settings
from ampkit.errors import UsageError


def _config(**overrides):
    base = dict(
        parallel="ddp",
        reduce_dtype="fp32",
        nproc_per_node=2,
        nnodes=1,
        precision="bf16-mixed",
        guard=False,
        detect_nonfinite=False,
        grad_stats_every=0,
        inject=None,
    )
    return SimpleNamespace(**{**base, **overrides})


@pytest.mark.parametrize("parallel", PARALLEL_MODES)
def test_plain_settings_pass(parallel):
    check_parallel_settings(_config(parallel=parallel, nproc_per_node=0 if parallel == "none" else 2))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"parallel": "tp"}, "unknown --parallel 'tp'"),
        ({"reduce_dtype": "fp16"}, "unknown --reduce-dtype 'fp16'"),
        ({"nproc_per_node": -1}, "--nproc-per-node must be >= 0"),
        ({"nnodes": 0}, "--nnodes must be >= 1"),
        ({"parallel": "none", "nproc_per_node": 2}, "add --parallel ddp or --parallel fsdp"),
        ({"guard": True}, "the NaN guard's rollback runs in a single process only"),
        ({"inject": "blocks.0.mlp:forward:nan"}, "--inject runs in a single process only"),
    ],
)
def test_settings_that_cannot_run_data_parallel_name_the_fix(overrides, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_parallel_settings(_config(**overrides))


def test_single_process_diagnostics_are_allowed_without_parallelism():
    check_parallel_settings(
        _config(parallel="none", nproc_per_node=0, guard=True, detect_nonfinite=True, grad_stats_every=5)
    )
