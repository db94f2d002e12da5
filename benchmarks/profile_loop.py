"""Profile `ampkit train`'s step on the `small` preset with torch.profiler, and measure what the
loop's choices buy: fused AdamW vs the foreach implementation, and a per-step `.item()` sync.

    python benchmarks/profile_loop.py [--model small] [--steps 4]

Prints the top operators by self CPU time, the share of the step spent in matmuls, attention,
the optimizer and elsewhere, and the step-time ratios; writes benchmarks/results/profile_loop.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ampkit.train import Features, TrainConfig, build_run
from common import print_table, write_result

GROUPS = {  # operator-name fragments -> what they are
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"),
    "attention": ("scaled_dot_product", "flash_attention", "_efficient_attention"),
    "optimizer": ("adam", "Optimizer.step"),
}


def _objs(model: str, **overrides):
    config = TrainConfig.of(
        model=model,
        steps=100,
        seq_len=256,
        batch_size=8,
        features=Features(batching="pack"),
        eval_batches=1,
        warmup_steps=2,
        **overrides,
    )
    return build_run(config)


def step_times(objs, steps: int, *, sync_each_step: bool = False) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        result = objs.trainer.train_step()
        if sync_each_step:
            result.loss.item()
        times.append(time.perf_counter() - start)
    return times


def profile_steps(objs, steps: int):
    step_times(objs, 2)  # warm up outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = sum(step_times(objs, steps))
    events = prof.key_averages()
    total_self_us = sum(e.self_cpu_time_total for e in events)
    shares = {
        name: sum(e.self_cpu_time_total for e in events if any(f in e.key for f in frags)) / total_self_us
        for name, frags in GROUPS.items()
    }
    shares["other"] = 1.0 - sum(shares.values())
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    return wall / steps, shares, [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in top]


def fused_vs_foreach(model: str, steps: int) -> float:
    """Median step time with AdamW(foreach) over AdamW(fused): > 1 means fused is faster."""
    fused = _objs(model)
    foreach = _objs(model)
    groups = foreach.optimizer.param_groups
    foreach.optimizer = foreach.trainer.optimizer = torch.optim.AdamW(
        [{k: v for k, v in g.items() if k in ("params", "weight_decay")} for g in groups],
        lr=groups[0]["lr"],
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=True,
    )
    foreach.trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(foreach.optimizer, lambda s: 1.0)
    a, b = [], []
    for _ in range(steps):  # interleaved
        a += step_times(fused, 1)
        b += step_times(foreach, 1)
    return statistics.median(b[1:]) / statistics.median(a[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    objs = _objs(args.model)
    step_s, shares, top = profile_steps(objs, args.steps)
    print(
        f"profile of ampkit's training step: {args.model}, fp32, seq 256 x batch 8 packed, {args.steps} steps, "
        f"{step_s * 1000:.0f} ms/step under the profiler"
    )
    print_table(["operator", "self ms/step", "calls/step"], [[k, f"{ms:.1f}", n] for k, ms, n in top])
    print_table(["where", "share of self CPU time"], [[k, f"{v:.1%}"] for k, v in shares.items()])
    plain, synced = [], []
    for _ in range(args.steps + 1):  # interleaved, so machine load hits both alike
        plain += step_times(objs, 1)
        synced += step_times(objs, 1, sync_each_step=True)
    base, synced = statistics.median(plain[1:]), statistics.median(synced[1:])
    fused_gain = fused_vs_foreach(args.model, args.steps + 1)
    print_table(
        ["choice", "step-time ratio"],
        [
            ["AdamW foreach / fused (fused is what ampkit uses)", f"{fused_gain:.3f}"],
            ["loss.item() every step / only at log steps", f"{synced / base:.3f}"],
        ],
    )
    write_result(
        "profile_loop",
        {
            "settings": vars(args),
            "step_ms": step_s * 1000,
            "shares": shares,
            "top_ops": top,
            "foreach_over_fused": fused_gain,
            "item_each_step_ratio": synced / base,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
