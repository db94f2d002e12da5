"""Run by torchrun with 2 CPU ranks (gloo) from test_sharded_load.py; writes OUT/rank-R.json.

ROOT holds the folders test_sharded_load.py wrote: `config` (a tiny Llama config, uneven shapes),
`weights` (its seeded model saved with save_pretrained: safetensors in several files + an index),
`bf16` (the same weights saved in bf16), `tied` (a tied head, safetensors), `bin` (the `weights`
values as pytorch_model.bin: loaded whole on every rank, today's path).
1. seeded: the config built on the meta device, `fully_shard`ed, materialised: each rank's shards are its
   slice of the one-process build (fp32 and bf16-true), bit for bit;
2. loaded: each safetensors folder the same way: each rank's shards are its slice of the file's tensors;
3. peak: the largest plain tensor any op allocated while materialising (1, 2), against the largest
   parameter;
4. train: 2 fp32 steps under FSDP2 from the per-shard load and from the whole load, both losses.
Blocks are made small (`DRAW_BLOCK`, `READ_BLOCK_BYTES`) so the tiny tensors take the blockwise paths.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ampkit.distributed.context import init_run
from ampkit.distributed.wrap import mixed_precision_policy, shard_fsdp
from ampkit.models import hf_init, hf_load
from ampkit.models.hf import build_hf_model
from ampkit.models.init import materialize
from ampkit.precision import build_precision, get_spec
from ampkit.shutdown import end_process
from ampkit.train import TrainConfig, build_run

hf_init.DRAW_BLOCK = 64  # elements: every weight here spans several blocks
hf_load.READ_BLOCK_BYTES = 256  # two rows of 32 fp32 values per read


class LargestTensor(TorchDispatchMode):
    """The most elements of any plain (non-DTensor, non-meta) tensor an op allocates: an output whose
    storage is none of its inputs' (views, in-place ops and safetensors' slices, which are views of the
    file's mapping, allocate nothing). DTensor ops allocate their local shards, below this mode."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        plain = [t for t in pytree.tree_leaves((args, kwargs)) if type(t) in (torch.Tensor, torch.nn.Parameter)]
        inputs = {t.untyped_storage().data_ptr() for t in plain if t.device.type != "meta"}
        for t in pytree.tree_leaves(out):
            fresh = type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta"
            if fresh and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.numel())
        return out


def sharded(spec: str, *, precision: str = "fp32", peak: LargestTensor | None = None) -> torch.nn.Module:
    """`spec` built on the meta device in `precision`'s storage dtype, sharded, then materialised."""
    policy = build_precision(precision, device_type="cpu")
    with policy.init_context():
        model = build_hf_model(spec, device="meta")
    shard_fsdp(
        model,
        mp_policy=mixed_precision_policy(get_spec(precision), reduce_dtype=torch.float32),
        blocks=list(model.blocks),
    )
    if peak is None:
        return materialize(model, device="cpu", seed=5)
    with peak:
        return materialize(model, device="cpu", seed=5)


def local_slice(full: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = torch.chunk(full, world, dim=0)
    return chunks[rank] if rank < len(chunks) else full[:0]


def compare(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> dict:
    names = [name for name, _ in model.hf.named_parameters()]
    equal = [
        name
        for name, p in model.hf.named_parameters()
        if name in reference and torch.equal(p.to_local(), local_slice(reference[name].to(p.dtype)))
    ]
    hf = model.hf
    return {
        "names": len(names),
        "equal": equal == names,
        "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "tied": hf.lm_head.weight is hf.model.embed_tokens.weight,
        # FSDP2 pads every rank's shard to ceil(rows / ranks) rows: the most a rank may allocate for one
        "largest_shard": max(
            -(-p.shape[0] // dist.get_world_size()) * (p.numel() // p.shape[0]) for p in model.parameters()
        ),
        "largest_full": max(p.numel() for p in model.parameters()),
    }


def probe_seeded(root: Path) -> dict:
    spec = f"hf:{root / 'config'}"
    report = {}
    for precision in ("fp32", "bf16-true"):
        peak = LargestTensor()
        model = sharded(spec, precision=precision, peak=peak)
        with build_precision(precision, device_type="cpu").init_context():
            whole = build_hf_model(spec, seed=5).hf.state_dict()
        report[precision] = {**compare(model, whole), "largest_seen": peak.largest}
    return report


def probe_loaded(root: Path) -> dict:
    from safetensors.torch import load_file

    report = {}
    for folder in ("weights", "bf16", "tied"):
        files = sorted((root / folder).glob("*.safetensors"))
        reference = {k: v for f in files for k, v in load_file(str(f)).items()}
        peak = LargestTensor()
        model = sharded(f"hf:{root / folder}", peak=peak)
        report[folder] = {
            **compare(model, reference),
            "largest_seen": peak.largest,
            "files": len(files),
            "file_dtypes": sorted({str(v.dtype) for v in reference.values()}),
        }
    return report


def probe_train(root: Path) -> dict:
    losses = {}
    for folder in ("weights", "bin"):
        config = TrainConfig.of(
            model=f"hf:{root / folder}", precision="fp32", parallel="fsdp", seq_len=32, batch_size=2,
            steps=2, warmup_steps=0, eval_batches=1,
        )  # fmt: skip
        objs = build_run(config)
        losses[folder] = {
            "meta_load": objs.task.meta_load(),
            "losses": [float(objs.trainer.train_step().loss) for _ in range(2)],
        }
    return losses


def main(root: Path, out: Path) -> None:
    report = {"seeded": probe_seeded(root), "loaded": probe_loaded(root), "train": probe_train(root)}
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(report, indent=2))
    run, _ = init_run(parallel="fsdp", device=torch.device("cpu"))  # ampkit's own teardown (probe_fsdp.py)
    run.close()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    end_process(0)  # as ampkit's own commands end: no teardown of torch's modules (~0.7 s a rank)
