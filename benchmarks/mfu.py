"""MFU of fp32 training on this device: model FLOPs per second of `ampkit train` over the measured
fp32 matmul peak (CPU) or the GPU table's peak. Packed batches (full rows, no padding), so every
computed token is a real one. Target on `small`: >= 0.6.

    python benchmarks/mfu.py [--models tiny,small] [--steps 12] [--seq-len 256] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ampkit.hardware import describe_device, measured_peak_flops, peak_flops
from ampkit.models.flops import training_flops_per_token
from ampkit.train import Features, TrainConfig, build_run, run_training
from common import print_table, write_result


def measure(model: str, *, steps: int, seq_len: int, batch_size: int, precision: str) -> dict:
    config = TrainConfig.of(
        model=model,
        precision=precision,
        steps=steps,
        seq_len=seq_len,
        batch_size=batch_size,
        features=Features(batching="pack"),
        eval_batches=1,
        warmup_steps=2,
    )
    objs = build_run(config)
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_training(objs, Path(tmp), show_progress=False)
    info = describe_device(objs.device)
    dtype = objs.policy.spec.compute_dtype
    key = {torch.float32: "tf32" if objs.policy.spec.tf32 else "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[
        dtype
    ]
    # Denominator: the GPU table's dense peak on CUDA; on CPU the measured matmul peak of that dtype.
    peak = peak_flops(info, key) if info.type == "cuda" else measured_peak_flops(objs.device, dtype)
    flops_per_token = training_flops_per_token(objs.model_config, seq_len)
    achieved = flops_per_token * summary["tokens_per_s"]
    return {
        "model": model,
        "precision": precision,
        "tokens_per_s": summary["tokens_per_s"],
        "flops_per_token": flops_per_token,
        "achieved_flops": achieved,
        "peak_flops": peak,
        "mfu": achieved / peak,
        "step_ms_median": summary["step_ms_median"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    results = [
        measure(m, steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size, precision=args.precision)
        for m in args.models.split(",")
    ]
    print(f"MFU, {args.precision}, seq {args.seq_len}, batch {args.batch_size}, packed rows, {args.steps} steps")
    print_table(
        ["model", "tokens/s", "GFLOP/token", "achieved GFLOP/s", "peak GFLOP/s", "MFU"],
        [
            [
                r["model"],
                f"{r['tokens_per_s']:,.0f}",
                f"{r['flops_per_token'] / 1e9:.3f}",
                f"{r['achieved_flops'] / 1e9:,.1f}",
                f"{r['peak_flops'] / 1e9:,.1f}",
                f"{r['mfu']:.3f}",
            ]
            for r in results
        ],
    )
    write_result(f"mfu_{args.precision}", {"settings": vars(args), "results": results, "target_small": 0.6})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
