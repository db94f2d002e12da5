"""Run by torchrun with 2 CPU ranks (gloo) from test_precision_probe.py; writes OUT/rank-R.json.

Probes ampkit's own builders (no ampkit code is changed here; torch functions are wrapped to record):
1. FSDP2 + bf16-mixed (reduce fp32, then bf16): the dtypes inside forward, of the reduce-scatter,
   of the gradients the optimizer sees, of the sharded parameters and the optimizer states.
2. FSDP2 + fp16-mixed: an inf planted in rank 1's gradient shard alone makes *both* ranks skip.
3. DDP + gradient accumulation: all-reduces per step are the same with 2 micro-batches as with 1.
4. DDP with --reduce-dtype bf16: the all-reduce carries bf16.
5. FSDP2 built on the meta device: each rank's shards are its slice of the one-process init (fp32,
   bf16-true, and uneven shapes), the tied head stays tied, and a rank holds only its shards.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ampkit.distributed.context import init_run
from ampkit.distributed.wrap import mixed_precision_policy, shard_fsdp
from ampkit.models import LlamaLM, ModelConfig, build_model
from ampkit.models.init import materialize
from ampkit.precision import ScalerConfig, get_spec
from ampkit.shutdown import end_process
from ampkit.train import TrainConfig, build_run

TINY = dict(model="tiny", seq_len=32, batch_size=2, steps=4, warmup_steps=0, eval_batches=1)


def _record_reduce_scatter(seen: list[str]):
    name = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
    real = getattr(dist, name)

    def recording(*args, **kwargs):
        tensor = kwargs.get("input", args[1] if len(args) > 1 else None)
        seen.append(str(tensor.dtype))
        return real(*args, **kwargs)

    setattr(dist, name, recording)
    return lambda: setattr(dist, name, real)


def probe_fsdp_bf16(reduce_dtype: str) -> dict:
    objs = build_run(TrainConfig.of(precision="bf16-mixed", parallel="fsdp", reduce_dtype=reduce_dtype, **TINY))
    forward_weights: set[str] = set()
    for module in objs.model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(
                lambda m, a: forward_weights.add(f"{type(m.weight).__name__}:{m.weight.dtype}")
            )
    grads: set[str] = set()
    objs.optimizer.register_step_pre_hook(
        lambda opt, a, k: grads.update(
            f"{type(p.grad).__name__}:{p.grad.dtype}" for g in opt.param_groups for p in g["params"]
        )
    )
    reduce_scatter: list[str] = []
    restore = _record_reduce_scatter(reduce_scatter)
    result = objs.trainer.train_step()
    restore()
    states = {
        f"{type(v).__name__}:{v.dtype}"
        for s in objs.optimizer.state.values()
        for k, v in s.items()
        if k in ("exp_avg", "exp_avg_sq")
    }
    params = {f"{type(p).__name__}:{p.dtype}:{p.placements[0]}" for p in objs.model.parameters()}
    return {
        "forward_weights": sorted(forward_weights),
        "reduce_scatter": sorted(set(reduce_scatter)),
        "grads": sorted(grads),
        "optimizer_states": sorted(states),
        "params": sorted(params),
        "loss": float(result.loss),
    }


def probe_fp16_scaler() -> dict:
    objs = build_run(
        TrainConfig.of(precision="fp16-mixed", parallel="fsdp", scaler=ScalerConfig(init_scale=1024.0), **TINY)
    )
    policy, rank = objs.policy, dist.get_rank()
    real_unscale = policy.unscale_gradients

    def poisoned_unscale(optimizer):
        if rank == 1:  # one element of one shard, on one rank only
            grad = next(p.grad.to_local() for p in objs.model.parameters() if p.grad.to_local().numel())
            grad.view(-1)[0] = float("inf")
        real_unscale(optimizer)

    policy.unscale_gradients = poisoned_unscale
    before = [p.detach().to_local().clone() for p in objs.model.parameters()]
    result = objs.trainer.train_step()
    unchanged = all(torch.equal(a, p.detach().to_local()) for a, p in zip(before, objs.model.parameters()))
    return {"stepped": result.stepped, "scale": policy.loss_scale(), "params_unchanged": unchanged}


def probe_ddp_no_sync() -> dict:
    objs = build_run(TrainConfig.of(precision="fp32", parallel="ddp", grad_accum=1, **TINY))
    calls: list[int] = []

    def counting(state, bucket):
        calls.append(1)
        return default_hooks.allreduce_hook(None, bucket)

    objs.model.register_comm_hook(state=None, hook=counting)
    objs.trainer.train_step()  # DDP rebuilds its buckets after the first step
    counts = {}
    for accum in (1, 2):
        objs.trainer.grad_accum = accum
        calls.clear()
        objs.trainer.train_step()
        counts[f"accum{accum}"] = len(calls)
    return counts


def probe_ddp_bf16_reduce() -> dict:
    objs = build_run(TrainConfig.of(precision="fp32", parallel="ddp", reduce_dtype="bf16", **TINY))
    seen: list[str] = []
    real = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        seen.append(str(tensor.dtype))
        return real(tensor, *args, **kwargs)

    dist.all_reduce = recording
    objs.trainer.train_step()
    dist.all_reduce = real
    return {"all_reduce": sorted(set(seen))}


def _compare_shards(sharded: torch.nn.Module, reference: torch.nn.Module) -> dict:
    """The sharded model against a one-process build (rounded to the shards' dtype); `full_tensor` is a
    collective, called in the same order on every rank."""
    ref = dict(reference.named_parameters())
    names = [name for name, _ in sharded.named_parameters()]
    equal = [
        name
        for name, p in sharded.named_parameters()
        if name in ref and torch.equal(p.full_tensor(), ref[name].detach().to(p.dtype))
    ]
    local = sum(p.to_local().numel() for p in sharded.parameters())
    return {
        "names_match": names == list(ref),
        "all_equal": equal == names,
        "tied": sharded.lm_head.weight is sharded.embed.weight,
        "local_fraction": round(local / sum(p.numel() for p in ref.values()), 2),
        "dtypes": sorted({str(p.dtype) for p in sharded.parameters()}),
    }


def probe_fsdp_init() -> dict:
    report = {}
    for precision in ("fp32", "bf16-true"):
        objs = build_run(TrainConfig.of(precision=precision, parallel="fsdp", **TINY))
        reference = objs.task.build_model(device=objs.device, seed=objs.config.seed)
        report[precision] = _compare_shards(objs.model, reference)
    # Odd vocabulary and d_ff: FSDP2 pads the last rank's shard; each rank still writes exactly its rows.
    cfg = ModelConfig(vocab_size=257, d_model=64, n_layers=2, n_heads=4, d_ff=99, tie_embeddings=True)
    with torch.device("meta"):
        model = LlamaLM(cfg)
    shard_fsdp(
        model, mp_policy=mixed_precision_policy(get_spec("fp32"), reduce_dtype=torch.float32), blocks=list(model.blocks)
    )
    materialize(model, device="cpu", seed=5)
    report["uneven"] = _compare_shards(model, build_model(cfg, seed=5))
    return report


def main(out: Path) -> None:
    torch.manual_seed(0)
    report = {
        "fsdp_bf16_reduce_fp32": probe_fsdp_bf16("fp32"),
        "fsdp_bf16_reduce_bf16": probe_fsdp_bf16("bf16"),
        "fp16_scaler": probe_fp16_scaler(),
        "ddp_no_sync": probe_ddp_no_sync(),
        "ddp_bf16_reduce": probe_ddp_bf16_reduce(),
        "fsdp_init": probe_fsdp_init(),
    }
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(report, indent=2))
    # ampkit's own teardown (barrier, then a meeting on the store): a bare destroy_process_group
    # here aborted rank 0 about one run in six under load ("terminate called without an active
    # exception": gloo's last barrier messages still in flight when the peer closed its pairs).
    run, _ = init_run(parallel="fsdp", device=torch.device("cpu"))  # joins the group build_run made
    run.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    end_process(0)  # as ampkit's own commands end: no teardown of torch's modules (~0.7 s a rank)
