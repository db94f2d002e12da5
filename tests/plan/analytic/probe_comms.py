"""Run by torchrun with 2 CPU ranks (gloo) from test_comms.py; writes OUT/rank-R.json.

Records the bytes ampkit's own training step really moves (no ampkit code is changed; torch's collective
functions are wrapped to record): FSDP2's all-gathers (the full output tensor of each) and reduce-scatters
(the full input tensor), and DDP's gradient all-reduces, over one optimizer step of 2 micro-batches, per
precision and reduce dtype: the ground truth `plan/analytic/comms.py`'s formula is checked against.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ampkit.distributed.context import init_run
from ampkit.shutdown import end_process
from ampkit.train import TrainConfig, build_run

TINY = dict(model="tiny", seq_len=32, batch_size=2, steps=4, warmup_steps=0, eval_batches=1, grad_accum=2)
GRADIENT_MIN_ELEMENTS = 64  # smaller all-reduces are the step's scalars (loss, found-inf), not gradient buckets


def _recording(name: str, tensor_arg: str, position: int, log: dict[str, int], key: str):
    real = getattr(dist, name)

    def recording(*args, **kwargs):
        tensor = kwargs.get(tensor_arg, args[position] if len(args) > position else None)
        if tensor.numel() >= GRADIENT_MIN_ELEMENTS:
            log[key] = log.get(key, 0) + tensor.numel() * tensor.element_size()
            log[f"{key}_calls"] = log.get(f"{key}_calls", 0) + 1
        return real(*args, **kwargs)

    setattr(dist, name, recording)
    return lambda: setattr(dist, name, real)


def probe_step(precision: str, parallel: str, reduce_dtype: str) -> dict[str, int]:
    objs = build_run(TrainConfig.of(precision=precision, parallel=parallel, reduce_dtype=reduce_dtype, **TINY))
    if parallel == "ddp" and reduce_dtype == "fp32":  # no hook of ampkit's: one that all-reduces through Python
        objs.model.register_comm_hook(state=None, hook=default_hooks.allreduce_hook)
    objs.trainer.train_step()  # warm: DDP rebuilds its buckets after the first step, FSDP2 initialises lazily
    log: dict[str, int] = {}
    gather = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    scatter = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
    restores = [
        _recording(gather, "output_tensor", 0, log, "all-gather"),
        _recording(scatter, "input", 1, log, "reduce-scatter"),
        _recording("all_reduce", "tensor", 0, log, "all-reduce"),
    ]
    objs.trainer.train_step()
    for restore in restores:
        restore()
    return log


def main(out: Path) -> None:
    torch.manual_seed(0)
    report = {
        f"{parallel}/{precision}/{reduce}": probe_step(precision, parallel, reduce)
        for parallel in ("fsdp", "ddp")
        for precision in ("fp32", "bf16-mixed")
        for reduce in ("fp32", "bf16")
    }
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(report, indent=2))
    run, _ = init_run(parallel="fsdp", device=torch.device("cpu"))  # ampkit's teardown (see probe_fsdp.py)
    run.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    end_process(0)  # as ampkit's own commands end: no teardown of torch's modules (~0.7 s a rank)
