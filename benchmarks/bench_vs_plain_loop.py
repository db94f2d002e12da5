"""Does `ampkit bench` report the tokens/s a plain PyTorch loop gets? (target: within 5%)

In one run, alternating, each in its own fresh process:
  (a) `ampkit bench --precisions fp32 --steps N` -> its fp32 tokens/s (summary.json);
  (b) a minimal hand-written fp32 loop: the same model (same preset and seed), the same batches
      (same sampler and seed), the same number of warmup and timed steps, fused AdamW, grad clipping.
The plain loop times each step with perf_counter and computes tokens/s itself (real tokens over the
summed step times); the stall-filtered figure (steps > 4x the median left out, as bench does) is
computed for both, too. Writes benchmarks/results/bench_vs_plain_loop.json.

    python benchmarks/bench_vs_plain_loop.py [--steps 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "bench_vs_plain_loop.json"
TARGET = 0.05  # |bench / plain - 1| must stay under this


def plain_loop(args: argparse.Namespace) -> dict:
    """The independent loop. Imports happen here, in the child process only."""
    import torch
    import torch.nn.functional as F

    from ampkit.data import ByteTokenizer, build_samplers, load_corpus
    from ampkit.models import build_model, get_preset

    sampler, _ = build_samplers(
        load_corpus(None),
        ByteTokenizer(),
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        seed=args.seed,
        max_val_batches=1,
    )
    model = build_model(get_preset(args.model, vocab_size=256), seed=args.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=True,
    )
    model.train()
    step_s, tokens, slots = [], [], []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        batch = sampler.next_batch()  # drawn inside the step, as bench's loop does
        logits = model(batch.input_ids)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            step_s.append(elapsed)
            tokens.append(batch.n_tokens)
            slots.append(batch.n_padded)
    return {"step_s": step_s, "tokens": tokens, "slots": slots}


def stall_filtered(step_s: list[float], tokens: list[int], slots: list[int]) -> float:
    from ampkit.bench.timing import summarize_steps

    return summarize_steps(step_s, tokens, slots).items_per_s


def run_plain(args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--plain-worker",
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--seq-len",
        str(args.seq_len),
        "--batch-size",
        str(args.batch_size),
        "--model",
        args.model,
    ]
    raw = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {
        "items_per_s_all": sum(raw["tokens"]) / sum(raw["step_s"]),
        "items_per_s": stall_filtered(raw["step_s"], raw["tokens"], raw["slots"]),
        "step_ms_median": 1000 * statistics.median(raw["step_s"]),
    }


def run_bench(args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "ampkit",
        "bench",
        "--precisions",
        "fp32",
        "--steps",
        str(args.steps),
        "--warmup-steps",
        str(args.warmup),
        "--seq-len",
        str(args.seq_len),
        "--batch-size",
        str(args.batch_size),
        "--model",
        args.model,
        "--out",
        str(out),
        "--json",
    ]
    summary = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    timing = summary["precisions"][0]["timing"]
    return {
        "items_per_s_all": timing["items_per_s_all"],
        "items_per_s": timing["items_per_s"],
        "step_ms_median": timing["step_ms_median"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_worker:
        print(json.dumps(plain_loop(args)))
        return 0
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):  # alternate, so drift in machine load hits both alike
            bench = run_bench(args, Path(tmp) / f"bench-{i}")
            plain = run_plain(args)
            rounds.append({"bench": bench, "plain": plain})
            print(
                f"round {i + 1}: bench {bench['items_per_s']:,.0f} tok/s, plain {plain['items_per_s']:,.0f} "
                f"tok/s (all steps: {bench['items_per_s_all']:,.0f} vs {plain['items_per_s_all']:,.0f})"
            )
    result = {"settings": {k: v for k, v in vars(args).items() if k != "plain_worker"}, "rounds": rounds}
    for key in ("items_per_s", "items_per_s_all"):
        bench = statistics.mean(r["bench"][key] for r in rounds)
        plain = statistics.mean(r["plain"][key] for r in rounds)
        result[f"ratio_{key}"] = bench / plain
    # the same comparison on the median step time (robust to stalls on either side); > 1: bench is faster
    result["ratio_step_ms_median"] = statistics.mean(r["plain"]["step_ms_median"] for r in rounds) / statistics.mean(
        r["bench"]["step_ms_median"] for r in rounds
    )
    ratio = result["ratio_items_per_s"]
    result.update(target=f"|ratio - 1| < {TARGET}", within_target=abs(ratio - 1) < TARGET, load_average=_load_average())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"bench / plain tokens/s = {ratio:.3f} (all steps: {result['ratio_items_per_s_all']:.3f}; "
        f"by median step time: {result['ratio_step_ms_median']:.3f}); "
        f"{'within' if result['within_target'] else 'OUTSIDE'} the {TARGET:.0%} target -> {RESULTS}"
    )
    return 0


def _load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
