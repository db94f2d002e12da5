"""The GPU check: one command, under 8 minutes on one H200, nothing installed from the internet.

    bash benchmarks/gpu_check.sh              # on a CUDA machine
    bash benchmarks/gpu_check.sh --dry-run    # the same code paths on CPU, tiny sizes, in under a minute

1. `ampkit hw --json`: native dtypes and measured matmul peaks.
2. `ampkit bench` on the gpt2-124m shape (seq 1024) for fp32, tf32, fp16-mixed, bf16-mixed and fp8 when
   torchao is present and the GPU is sm89+: tokens/s ratios against fp32 (goals: bf16-mixed >= 3x, tf32 >= 2x).
3. `ampkit train` of the 1b shape in bf16-mixed (seq 2048, packed) without and with --compile: MFU against the
   GPU table's bf16 peak (goal >= 45% with compile), and the planner's predicted tensor peak against
   torch.cuda.max_memory_allocated (goal: within 10%).
Writes everything to one JSON file (default benchmarks/results/gpu_check.json; --out FILE) and prints a table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ampkit(*args: str, timeout_s: float) -> dict:
    """Run an ampkit command with --json; return its parsed summary (raises with stderr on failure)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ampkit", *args, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=timeout_s
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ampkit {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout)


def sizes(dry_run: bool) -> dict:
    if dry_run:
        return {
            "device": "cpu",
            "bench_model": "tiny",
            "bench_seq": 64,
            "bench_batch": 2,
            "budget_s": 1.0,
            "precisions": ["fp32", "bf16-mixed"],
            "train_model": "tiny",
            "train_seq": 64,
            "train_batch": 2,
            "train_steps": 4,
            "compile": False,
        }
    precisions = ["fp32", "tf32", "fp16-mixed", "bf16-mixed"]
    import torch

    if importlib.util.find_spec("torchao") and torch.cuda.get_device_capability() >= (8, 9):
        precisions.append("fp8")
    return {
        "device": "cuda",
        "bench_model": "gpt2-124m",
        "bench_seq": 1024,
        "bench_batch": 16,
        "budget_s": 15.0,
        "precisions": precisions,
        "train_model": "1b",
        "train_seq": 2048,
        "train_batch": 4,
        "train_steps": 20,
        "compile": True,
    }


def planner_peak_bytes(model: str, seq_len: int, batch: int) -> int:
    from ampkit.plan import StepSetting, analytic_ledger, describe_model

    desc = describe_model(model, vocab_size=256)  # ampkit train uses the byte tokenizer: vocabulary 256
    setting = StepSetting(precision="bf16-mixed", optimizer="adamw", micro_batch=batch, seq_len=seq_len)
    return analytic_ledger(desc, setting).tensor_peak


def mfu(summary: dict, model: str, seq_len: int, device_peak_flops: float | None) -> float | None:
    from ampkit.models import get_preset
    from ampkit.models.flops import training_flops_per_token

    if not device_peak_flops or not summary.get("tokens_per_s"):
        return None
    cfg = get_preset(model, vocab_size=256)
    return training_flops_per_token(cfg, seq_len) * summary["tokens_per_s"] / device_peak_flops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="same code paths on CPU with tiny sizes")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    args = parser.parse_args()
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device here; run with --dry-run to check the code paths on CPU", file=sys.stderr)
            return 2
    s = sizes(args.dry_run)
    started = time.perf_counter()
    result: dict = {"dry_run": args.dry_run, "sizes": s}
    with tempfile.TemporaryDirectory() as tmp:
        hw = ampkit("hw", "--device", s["device"], *(["--quick"] if args.dry_run else []), timeout_s=120)
        result["hw"] = hw
        bench = ampkit(
            "bench",
            "--device",
            s["device"],
            "--model",
            s["bench_model"],
            "--precisions",
            ",".join(s["precisions"]),
            "--seq-len",
            str(s["bench_seq"]),
            "--batch-size",
            str(s["bench_batch"]),
            "--budget-s",
            str(s["budget_s"]),
            "--out",
            f"{tmp}/bench",
            timeout_s=300,
        )
        result["bench"] = bench
        from ampkit.hardware import describe_device, peak_flops

        info = describe_device(s["device"])
        bf16_peak = peak_flops(info, "bf16") if info.type == "cuda" else None
        runs = {}
        for compiled in [False, True] if s["compile"] else [False]:
            name = "compile" if compiled else "eager"
            summary = ampkit(
                "train",
                "--device",
                s["device"],
                "--model",
                s["train_model"],
                "--precision",
                "bf16-mixed",
                "--steps",
                str(s["train_steps"]),
                "--seq-len",
                str(s["train_seq"]),
                "--batch-size",
                str(s["train_batch"]),
                "--batching",
                "pack",
                "--eval-batches",
                "1",
                *(["--compile"] if compiled else []),
                "--out",
                f"{tmp}/train-{name}",
                timeout_s=300,
            )
            runs[name] = {
                "tokens_per_s": summary["tokens_per_s"],
                "step_ms_median": summary["step_ms_median"],
                "peak_memory": summary["peak_memory"],
                "mfu": mfu(summary, s["train_model"], s["train_seq"], bf16_peak),
            }
        result["train_1b"] = runs
        predicted = planner_peak_bytes(s["train_model"], s["train_seq"], s["train_batch"])
        measured = runs["eager"]["peak_memory"].get("max_allocated_bytes")
        result["planner"] = {
            "predicted_tensor_peak_bytes": predicted,
            "measured_max_allocated_bytes": measured,
            "ratio": predicted / measured if measured else None,
        }
    result["wall_s"] = round(time.perf_counter() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print_report(result)
    return 0


def print_report(result: dict) -> None:
    print(f"gpu check ({'dry run on CPU' if result['dry_run'] else 'CUDA'}), {result['wall_s']} s")
    for row in result["bench"]["precisions"]:
        timing, vs = row.get("timing") or {}, row.get("vs_fp32") or {}
        print(
            f"  bench {row['name']:>12}: {row['status']:>9}  tokens/s {timing.get('tokens_per_s') or 0:>12,.0f}"
            f"  vs fp32 {vs.get('speedup') or 0:.2f}x  MFU {(row.get('mfu') or {}).get('value') or 0:.1%}"
        )
    rec = result["bench"].get("recommendation") or {}
    print(f"  recommendation: {rec.get('precision')}: {rec.get('reason')}")
    for name, run in result["train_1b"].items():
        m = run["mfu"]
        print(
            f"  train {result['sizes']['train_model']} bf16-mixed {name}: tokens/s {run['tokens_per_s']:,.0f}"
            f"  MFU {'n/a (CPU)' if m is None else f'{m:.1%}'}"
        )
    p = result["planner"]
    ratio = "n/a (CPU: no allocator peak)" if p["ratio"] is None else f"{p['ratio']:.3f}"
    print(f"  planner tensor peak {p['predicted_tensor_peak_bytes'] / 2**30:.3f} GiB vs measured: {ratio}")


if __name__ == "__main__":
    raise SystemExit(main())
