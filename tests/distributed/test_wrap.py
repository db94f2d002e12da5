"""ampkit.distributed.wrap: FSDP2's precision policy, what can be sharded, the one-process pass-through."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ampkit.distributed.wrap import REDUCE_DTYPE, mixed_precision_policy, shard_fsdp, wrap_model
from ampkit.errors import UsageError
from ampkit.precision import get_spec


@pytest.mark.parametrize(
    ("precision", "param_dtype"),
    [("bf16-mixed", torch.bfloat16), ("fp16-mixed", torch.float16), ("fp32", None), ("bf16-true", None)],
)
def test_fsdp_gathers_autocast_regimes_in_their_compute_dtype(precision, param_dtype):
    policy = mixed_precision_policy(get_spec(precision), reduce_dtype=REDUCE_DTYPE["fp32"])
    assert policy.param_dtype == param_dtype and policy.reduce_dtype == torch.float32


def test_a_model_without_blocks_cannot_be_sharded_and_the_error_says_what_to_use():
    with pytest.raises(UsageError, match="needs a `blocks` ModuleList; Sequential has none: use --parallel ddp"):
        shard_fsdp(nn.Sequential(nn.Linear(2, 2)), mp_policy=None)


def test_a_one_process_run_returns_the_model_as_is():
    model = nn.Linear(2, 2)
    run = SimpleNamespace(mode="none")
    assert wrap_model(model, run=run, spec=get_spec("bf16-mixed"), reduce_dtype="bf16") is model
