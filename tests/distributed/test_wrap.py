"""ampkit.distributed.wrap: FSDP2's precision policy, what can be sharded, the one-process pass-through."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ampkit.distributed.wrap import mixed_precision_policy, shard_fsdp, wrap_model
from ampkit.precision import get_spec


@pytest.mark.parametrize(
    ("precision", "param_dtype"),
    [("bf16-mixed", torch.bfloat16), ("fp16-mixed", torch.float16), ("fp32", None), ("bf16-true", None)],
)
def test_fsdp_gathers_autocast_regimes_in_their_compute_dtype(precision, param_dtype):
    policy = mixed_precision_policy(get_spec(precision), reduce_dtype=torch.float32)
    assert policy.param_dtype == param_dtype and policy.reduce_dtype == torch.float32


@pytest.fixture
def one_rank_group():
    """A one-process gloo group: enough for `fully_shard` to build its sharding (world size 1)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_fsdp_shards_the_tasks_blocks_then_the_root(one_rank_group):
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

    model = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2))
    shard_fsdp(model, mp_policy=MixedPrecisionPolicy(), blocks=[model[0]])
    assert isinstance(model, FSDPModule) and isinstance(model[0], FSDPModule)
    assert not isinstance(model[2], FSDPModule)  # not named as a block: part of the root's unit


def test_a_model_naming_no_blocks_is_sharded_as_one_unit(one_rank_group):
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

    model = nn.Sequential(nn.Linear(2, 2))
    shard_fsdp(model, mp_policy=MixedPrecisionPolicy(), blocks=[])
    assert isinstance(model, FSDPModule) and not isinstance(model[0], FSDPModule)


def test_a_one_process_run_returns_the_model_as_is():
    model = nn.Linear(2, 2)
    run = SimpleNamespace(mode="none")
    assert wrap_model(model, run=run, spec=get_spec("bf16-mixed"), reduce_dtype="bf16") is model
