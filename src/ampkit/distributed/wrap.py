"""Data-parallel wrappers: DDP (replicated weights) and FSDP2 (`fully_shard`, sharded weights).

Order of application (torchtitan's `parallelize_llama` order, minus tensor parallelism; the run's
builder is `ampkit.train.build.build_run_model`):
    model on the meta device, in its storage dtype  ->  precision policy converts the module
    ->  activation checkpointing  ->  torch.compile  ->  fully_shard (on meta)
    ->  to_empty + init_weights (each rank its shards)  ->  DDP (real weights)  ->  optimizer
Sharding goes after checkpointing and compile because it replaces parameters by DTensors and hooks
every block: checkpointing must already wrap the blocks whose forwards FSDP2 re-gathers around, and
the optimizer must see the sharded parameters it will update. FSDP2 shards a meta-device model (only
metadata), so weights are first allocated already sharded; DDP needs real weights to wrap.

Precision under FSDP2 comes from a `MixedPrecisionPolicy`, not from the weights:
- `param_dtype` is the precision's compute dtype for the *-mixed regimes (bf16 for bf16-mixed, fp16
  for fp16-mixed): FSDP2 all-gathers the fp32 shards into bf16/fp16 copies for forward and backward.
  The sharded master weights, their gradients and the optimizer states stay fp32.
  Other regimes keep their parameters' dtype (None).
- `reduce_dtype` is its own setting (`--reduce-dtype`, default fp32): gradients are reduce-scattered
  in fp32 even when computed in bf16, because a bf16 sum over many ranks loses the low bits of every
  gradient (torchtitan's `mixed_precision_reduce` defaults to fp32 for the same reason).
Autocast still wraps forward and loss (the policy's `forward_context`): it keeps softmax, norms and
the loss in fp32 while the matmuls take the bf16/fp16 weights FSDP2 gathered.

DDP reduces gradients in their own dtype (fp32 for every *-mixed regime). A `--reduce-dtype` other
than the gradients' dtype installs a communication hook that casts each bucket for the all-reduce
and back (bf16: half the traffic, the precision trade-off above).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from ampkit.formats import dtype_of

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel


def mixed_precision_policy(spec, *, reduce_dtype: torch.dtype):
    """FSDP2's policy for a `PrecisionSpec`: compute-dtype params for autocast regimes, else the params' own."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=spec.compute_dtype if spec.autocast else None, reduce_dtype=reduce_dtype)


def shard_fsdp(model: nn.Module, *, mp_policy, blocks: list[nn.Module]) -> nn.Module:
    """`fully_shard` every repeated block the task names, then the root (embeddings, norms, head,
    whatever is left; a task that names no blocks is sharded as one unit, the root).

    Each block is one all-gather / reduce-scatter unit, so only one block's full weights exist at a
    time (plus prefetch). Preconditions: runs under an initialized process group; the model is on this
    rank's device, or on the meta device (then `ampkit.models.init.materialize` allocates and
    initialises the shards afterwards).
    """
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
    return model


def wrap_ddp(
    model: nn.Module, *, device: torch.device, grad_dtype: torch.dtype, reduce_dtype: torch.dtype, world_size: int
) -> DistributedDataParallel:
    """DDP without a buffer broadcast per forward (RoPE tables are computed, identical on every rank)."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type != "cpu" else None, forward_sync_buffers=False
    )
    if reduce_dtype != grad_dtype:
        ddp.register_comm_hook(state=None, hook=reduce_in_dtype_hook(reduce_dtype, world_size=world_size))
    return ddp


def reduce_in_dtype_hook(dtype: torch.dtype, *, world_size: int) -> Callable:
    """A DDP communication hook: all-reduce each gradient bucket in `dtype`, averaged, then cast back."""
    import torch.distributed as dist

    def hook(state, bucket):
        buffer = bucket.buffer()
        wire = buffer.to(dtype).div_(world_size)  # divide first: a sum of W bf16 values can overflow fp16
        future = dist.all_reduce(wire, async_op=True).get_future()

        def back(fut):
            buffer.copy_(fut.value()[0])
            return buffer

        return future.then(back)

    return hook


def wrap_model(model: nn.Module, *, run, spec, reduce_dtype: str, blocks: list[nn.Module] | None = None) -> nn.Module:
    """Wrap for `run.mode` and install the gradient-sync hook the training loop calls.

    Precondition: the precision policy converted `model`; checkpointing and compile are applied; the
    optimizer is built afterwards. FSDP2: the model may be on the meta device; DDP: it must be
    materialised. `run` is a `ProcessGroupRun` (or `LocalRun`: model returned as is). `blocks`: the
    task's repeated blocks, FSDP2's units.
    """
    if run.mode == "none":
        return model
    reduce = dtype_of(reduce_dtype, flag="--reduce-dtype")
    if run.mode == "fsdp":
        # FSDP2 reduce-scatters after every micro-batch's backward and accumulates the sharded fp32
        # gradients: no unsharded gradient is ever held across micro-batches (memory over traffic).
        return shard_fsdp(model, mp_policy=mixed_precision_policy(spec, reduce_dtype=reduce), blocks=blocks or [])
    ddp = wrap_ddp(
        model, device=run.device, grad_dtype=spec.param_dtype, reduce_dtype=reduce, world_size=run.world_size
    )
    # Gradient accumulation: all-reduce once, in the last micro-batch's backward (`no_sync` before).
    run.grad_sync = lambda last: contextlib.nullcontext() if last else ddp.no_sync()
    return ddp


def reshard(model: nn.Module) -> None:
    """Put FSDP2's parameters back in their sharded state. A forward with no backward (the first-batch
    check of a user's task) leaves the root module unsharded; an optimizer built then would hold the
    unsharded tensors, which FSDP2 frees at the next reshard. A no-op for a model FSDP2 did not wrap."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def unwrap(model: nn.Module) -> nn.Module:
    """The model DDP wraps (`ddp.module`, whose module paths are the task's: `blocks.0`, not
    `module.blocks.0`), for hooks that name modules by path; FSDP2 shards in place: returned as is."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model
