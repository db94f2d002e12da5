"""Loop overhead: `ampkit train` (its real run loop: policy hooks, logging, metrics file) against a
minimal hand-written PyTorch loop (the seeds' loop: autocast + GradScaler + unscale + clip), same
model, batches and steps, interleaved in rounds in one process. Target: ratio >= 0.98.

    python benchmarks/loop_overhead.py [--model tiny] [--precision fp32] [--rounds 3] [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ampkit.models import causal_lm_loss
from ampkit.train import TrainConfig, build_run, run_training
from common import print_table, write_result

WARMUP = 2


def ampkit_round(config: TrainConfig) -> float:
    """tokens/s of a real `ampkit train` run (the summary excludes the first 2 steps)."""
    objs = build_run(config)
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_training(objs, Path(tmp), show_progress=False)
    return summary["tokens_per_s"]


def plain_round(config: TrainConfig) -> float:
    """The same model, data and optimizer, driven by a hand-written loop."""
    objs = build_run(config)  # only for identical model, sampler and optimizer construction
    model, opt, sampler, device = objs.model, objs.optimizer, objs.sampler, objs.device
    spec = objs.policy.spec
    scaler = torch.amp.GradScaler(device.type, enabled=spec.loss_scaling)
    tokens, seconds = 0, 0.0
    for step in range(config.steps):
        start = time.perf_counter()
        batch = sampler.next_batch().to(device)
        with torch.autocast(device.type, dtype=spec.compute_dtype, enabled=spec.autocast):
            loss = causal_lm_loss(model(batch.input_ids), batch.targets)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.optimizer.clip_grad_norm)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        objs.scheduler.step()
        loss.item()  # what any loop that prints its loss pays
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= WARMUP:
            seconds += time.perf_counter() - start
            tokens += batch.n_tokens
    return tokens / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = TrainConfig.of(
        model=args.model,
        precision=args.precision,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
        eval_batches=1,
        warmup_steps=5,
    )
    ampkit_tps, plain_tps = [], []
    for _ in range(args.rounds):  # interleaved: drift in machine load hits both sides alike
        plain_tps.append(plain_round(config))
        ampkit_tps.append(ampkit_round(config))
    ratio = statistics.median(ampkit_tps) / statistics.median(plain_tps)
    rows = [
        [f"round {i + 1}", f"{a:,.0f}", f"{p:,.0f}", f"{a / p:.3f}"]
        for i, (a, p) in enumerate(zip(ampkit_tps, plain_tps))
    ]
    rows.append(
        ["median", f"{statistics.median(ampkit_tps):,.0f}", f"{statistics.median(plain_tps):,.0f}", f"{ratio:.3f}"]
    )
    print(
        f"loop overhead: {args.model}, {args.precision}, seq {args.seq_len}, batch {args.batch_size}, "
        f"{args.steps} steps x {args.rounds} rounds (tokens/s, real tokens)"
    )
    print_table(["", "ampkit train", "hand-written", "ratio"], rows)
    write_result(
        f"loop_overhead_{args.model}_{args.precision}",
        {
            "settings": vars(args),
            "ampkit_tokens_per_s": ampkit_tps,
            "plain_tokens_per_s": plain_tps,
            "ratio_median": ratio,
            "target": 0.98,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
