"""What do `train`'s diagnostics cost? (target: gradient statistics every step < 5% of tokens/s;
the locator switched off costs nothing measurable)

One process, one run (one model, one optimizer), the `train` step itself (`Trainer.train_step`),
fp32, on one fixed batch repeated, the one of median width among the first 31 (a padded batch's
width changes from batch to batch, and with it the step time: that noise would swamp a few percent).
Variants alternate in short blocks, in a rotating order, so drift and background load hit them all alike:
  plain        a build without any diagnostics hook (the loop calls nothing extra)
  off          the loop as `train` runs it with every diagnostic off: `build_train_diagnostics`
               returns its do-nothing object, called before each step and at each log step
  grad_stats   `--grad-stats-every 1`: statistics computed on device every step, drained at log
               steps (every step here, as on CPU)
  locator      `--detect-nonfinite` (for scale: a host sync per module call; not a target)
Figures: tokens/s per variant from its median step time, and the median over rounds of each
round's ratio of median step times against `plain` (robust to a noisy neighbour). Writes
benchmarks/results/diagnostics_overhead.json.

    python benchmarks/diagnostics_overhead.py [--model tiny] [--rounds 40] [--block 1] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from ampkit.diagnostics.train_hooks import build_train_diagnostics
from ampkit.train import TrainConfig, build_run

RESULTS = Path(__file__).resolve().parent / "results" / "diagnostics_overhead.json"
TARGET_GRAD_STATS = 0.05
VARIANTS = ("plain", "off", "grad_stats", "locator")


class _SameBatch:
    """A sampler that returns one batch forever."""

    def __init__(self, batch):
        self.batch = batch

    def next_batch(self):
        return self.batch


def _typical_batch(sampler, candidates: int = 31):
    """The batch of median padded width among the first `candidates`: a typical step, not a lucky one."""
    batches = sorted((sampler.next_batch() for _ in range(candidates)), key=lambda b: b.input_ids.shape[1])
    return batches[len(batches) // 2]


class _Metrics:
    """Stands in for metrics.jsonl: keeps records in memory (writing them is not what we measure)."""

    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)


def _diagnostics(objs, variant: str):
    if variant == "plain":
        return None
    guard = dataclasses.replace(
        objs.config.guard, grad_stats_every=1 if variant == "grad_stats" else 0, detect_nonfinite=variant == "locator"
    )
    return build_train_diagnostics(objs, guard, micro_batches=objs.config.grad_accum)


def run_block(objs, variant: str, steps: int, step0: int, metrics: _Metrics) -> list[float]:
    """`steps` train steps of one variant; returns each step's seconds."""
    diagnostics = _diagnostics(objs, variant)
    seconds = []
    try:
        for i in range(steps):
            start = time.perf_counter()
            if diagnostics is not None:
                diagnostics.begin_step(step0 + i)
            result = objs.trainer.train_step()
            result.loss.item()  # the log step's sync, as `train` does on CPU (log_every 1)
            if diagnostics is not None:
                diagnostics.at_log_step(step0 + i, metrics)
            seconds.append(time.perf_counter() - start)
    finally:
        if diagnostics is not None:
            diagnostics.close()
    return seconds


def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    config = TrainConfig.of(
        model=args.model,
        precision="fp32",
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=10**6,
        warmup_steps=0,
        eval_batches=1,
        seed=0,
    )
    objs = build_run(config)
    batch = _typical_batch(objs.sampler)
    objs.trainer.sampler = _SameBatch(batch)
    metrics = _Metrics()
    step = 1
    for _ in range(args.warmup):  # allocator and kernel warm-up, untimed
        run_block(objs, "plain", 1, step, metrics)
        step += 1
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    per_round: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        round_median = {}
        for variant in order:
            seconds = run_block(objs, variant, args.block, step, metrics)
            step += args.block
            times[variant] += seconds
            round_median[variant] = statistics.median(seconds)
        for variant in VARIANTS:
            per_round[variant].append(round_median["plain"] / round_median[variant])  # tokens/s ratio
    tokens_per_s = {v: batch.n_tokens / statistics.median(times[v]) for v in VARIANTS}
    median_ratio = {v: statistics.median(per_round[v]) for v in VARIANTS}
    overhead = 1.0 - median_ratio["grad_stats"]
    return {
        "model": args.model,
        "precision": "fp32",
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps_per_block": args.block,
        "parameters": sum(p.numel() for p in objs.model.parameters()),
        "tokens_per_step": batch.n_tokens,
        "batch_shape": list(batch.input_ids.shape),
        "tokens_per_s": tokens_per_s,
        "step_ms_median": {v: 1000 * statistics.median(times[v]) for v in VARIANTS},
        "ratio_vs_plain_median": median_ratio,
        "ratio_vs_plain_per_round": per_round,
        "grad_stats_overhead": overhead,
        "locator_off_overhead": 1.0 - median_ratio["off"],
        "locator_on_slowdown_x": 1.0 / median_ratio["locator"],
        "target_grad_stats_overhead": TARGET_GRAD_STATS,
        "grad_stats_target_met": overhead < TARGET_GRAD_STATS,
        "grad_stats_records": sum(1 for r in metrics.records if r.get("event") == "grad_stats"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=1, help="steps per variant per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    tps, ratio = result["tokens_per_s"], result["ratio_vs_plain_median"]
    print(
        f"{args.model} fp32, seq {args.seq_len} x batch {args.batch_size}, {args.threads} threads, "
        f"{args.rounds} rounds x {args.block} steps per variant"
    )
    for variant in VARIANTS:
        print(f"  {variant:<11} {tps[variant]:>10,.0f} tokens/s   median ratio vs plain {ratio[variant]:.3f}")
    print(
        f"gradient statistics every step: {100 * result['grad_stats_overhead']:+.1f}% overhead "
        f"(target < {100 * TARGET_GRAD_STATS:.0f}%: {'met' if result['grad_stats_target_met'] else 'NOT met'})"
    )
    print(
        f"diagnostics off vs no hooks: {100 * result['locator_off_overhead']:+.1f}%; "
        f"locator on: {result['locator_on_slowdown_x']:.1f}x slower"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
