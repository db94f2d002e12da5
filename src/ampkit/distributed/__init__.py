"""Beyond one process: torchrun, DDP, FSDP2 with a mixed-precision policy, sharded checkpoints.

ampkit uses PyTorch's own distributed engine and adds only the seams a training run needs:
- `settings`: the config vocabulary (`--parallel`, `--reduce-dtype`, `--nproc`) and its checks;
- `context`: the process group from torchrun's environment, rank gating, metric reductions;
- `sampler`: one seeded batch stream dealt out to the ranks;
- `wrap`: DDP and FSDP2 (`fully_shard` per block, then the root, `MixedPrecisionPolicy`);
- `checkpoint`: `torch.distributed.checkpoint` saves that are marked complete only when whole;
- `launch`: `ampkit train --nproc N` re-launched through torchrun's own launcher.

Submodules are imported where used (`ampkit.distributed.wrap` ...): this package imports nothing.
"""
