"""The data share of a training step: token shards read through a memory map vs the same corpus in
memory, from torch.profiler's `data` row (`ampkit.bench.profile`: the batch fetch and its move to
the device, a scope around the sampler) over a few profiled steps.

1. Prepares --data (default: the embedded corpus) into token shards with `ampkit.data.prepare`
   (--shard-tokens a shard, so a run crosses shards), with --model's tokenizer.
2. Builds one `ampkit train` run on each form (the same model, seed, sequence length, batch size and
   --batching: the same batches, a test checks it), warms up --warmup steps (the page cache filled),
   then profiles --steps single steps (`profile_step`) and takes the median of each figure.
3. Prints data ms, its share of the step, and the step ms per form; writes
   benchmarks/results/data_share.json.

Wall times are only meaningful on an idle machine; on a loaded one the shares are still the step's
own split, the absolute times are not.

    python benchmarks/data_share.py [--model tiny] [--seq-len 256] [--batch-size 8] [--steps 10]
    python benchmarks/data_share.py --seq-len 32 --batch-size 2 --steps 2 --warmup 1   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result

FORMS = ("in-memory", "shards")


def profiled(data: str, args: argparse.Namespace) -> dict:
    """Median data ms, data share and step ms over `args.steps` profiled steps of a run on `data`."""
    from ampkit.bench.profile import profile_step
    from ampkit.train import Features, TrainConfig, build_run

    config = TrainConfig.of(
        model=args.model,
        data=data,
        steps=args.warmup + args.steps + 1,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        features=Features(batching=args.batching),
        eval_batches=1,
        warmup_steps=1,
    )
    objs = build_run(config)
    for _ in range(args.warmup):  # the page cache filled, the allocator warm: not profiled
        objs.trainer.train_step()
    rows = []
    for _ in range(args.steps):
        _, report, _ = profile_step(objs.trainer, device=torch.device("cpu"))
        rows.append((report["ms"]["data"], report["shares"]["data"], report["step_ms"]))
    data_ms, share, step_ms = (statistics.median(column) for column in zip(*rows))
    return {"data_ms": data_ms, "data_share": share, "step_ms": step_ms, "profiled_steps": len(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="default", help="a text source --data takes (default: the embedded corpus)")
    parser.add_argument("--model", default="tiny", help="the model (its tokenizer prepares the shards)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batching", default="pack", choices=("pad", "bucket", "pack"))
    parser.add_argument("--steps", type=int, default=10, help="profiled steps a form")
    parser.add_argument("--warmup", type=int, default=3, help="unprofiled steps first")
    parser.add_argument("--shard-tokens", type=int, default=50_000, help="tokens a shard (several shards a run)")
    args = parser.parse_args()
    from ampkit.data.hf_tokenizer import tokenizer_for_model
    from ampkit.data.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        shards = Path(tmp) / "shards"
        prepared = prepare(args.data, shards, tokenizer=tokenizer_for_model(args.model), shard_tokens=args.shard_tokens)
        results = {form: profiled(args.data if form == "in-memory" else str(shards), args) for form in FORMS}
    rows = [
        [form, f"{r['data_ms']:.3f}", f"{r['data_share']:.2%}", f"{r['step_ms']:.1f}", str(r["profiled_steps"])]
        for form, r in results.items()
    ]
    print_table(["data", "data ms (median)", "data share of step", "step ms (median)", "steps"], rows)
    path = write_result(
        "data_share",
        {
            "settings": vars(args),
            "load_average": os.getloadavg(),
            "shards": {"shards": prepared.shards, "tokens": prepared.tokens, "dtype": prepared.dtype},
            "forms": results,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
