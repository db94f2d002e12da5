"""`make bench`: run every benchmark in one go and rewrite docs/benchmarks.md with the machine, the
date, each command and the table it printed. Each script also writes its JSON to benchmarks/results/.

    python benchmarks/run_all.py [--only NAME[,NAME...]] [--skip NAME[,NAME...]]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOC = ROOT / "docs" / "benchmarks.md"

# (name, argv after `python`, what it measures). Order: cheapest first.
BENCHMARKS = [
    ("hw", ["-m", "ampkit", "hw"], "native dtypes and measured matmul throughput per dtype"),
    (
        "build_memory",
        ["benchmarks/build_memory.py"],
        "peak memory of building a run: 1b under bf16-true (no fp32 copy), small under FSDP2 with 2 ranks",
    ),
    (
        "sharded_load",
        ["benchmarks/sharded_load.py"],
        "an hf: 1B-shaped Llama (random init) built on the meta device, sharded, then materialised on 2 FSDP2 "
        "ranks: peak RSS per rank vs one whole-model build in one process (target <= 0.6x)",
    ),
    (
        "train_acceptance",
        ["benchmarks/train_acceptance.py"],
        "ampkit train: 300 fp32 steps under 3 min, loss drop >= 40%; fp16-mixed 20 steps",
    ),
    (
        "loop_overhead",
        ["benchmarks/loop_overhead.py"],
        "ampkit train vs a hand-written autocast+GradScaler loop (target >= 0.98)",
    ),
    ("mfu", ["benchmarks/mfu.py"], "MFU of fp32 training vs the measured matmul peak (target >= 0.6 on small)"),
    (
        "profile_loop",
        ["benchmarks/profile_loop.py"],
        "torch.profiler of the small preset's step; fused AdamW and per-step sync costs",
    ),
    (
        "bench_budget",
        ["benchmarks/bench_budget.py", "--model", "small", "--budget-s", "5"],
        "ampkit bench --model small --budget-s 5: wall time incl. start-up within (budget x precisions + "
        "start-up + fidelity) x 1.2 and under 165 s",
    ),
    (
        "bench_vs_plain_loop",
        ["benchmarks/bench_vs_plain_loop.py"],
        "bench's fp32 tokens/s vs an independent plain loop (within 5%)",
    ),
    (
        "diagnostics_overhead",
        ["benchmarks/diagnostics_overhead.py"],
        "cost of gradient statistics and the locator (target < 5%)",
    ),
    ("throughput_stack", ["benchmarks/throughput_stack.py"], "pack/bucket vs pad, checkpointing, 8-bit Adam, compile"),
    ("plan_speed", ["benchmarks/plan_speed.py"], "planner speed: analytic 70b, traced 1b"),
    (
        "plan_hf_70b",
        ["benchmarks/plan_hf_70b.py"],
        "ampkit plan of a 70B-shaped transformers Llama config on H100-80GB, every row traced by extrapolation "
        "(target < 5 s); extrapolated vs full trace of a 24-layer model (target within 1%)",
    ),
    (
        "plan_real_size",
        ["benchmarks/plan_real_size.py"],
        "ampkit plan of real-size transformers configs on H100-80GB (Qwen3-0.6B, Gemma-2-2B, Phi-3-mini, "
        "Mixtral-8x7B, OLMo-2-1B: traced only; Llama-3-70B), fresh process, cold trace cache (target < 10 s each)",
    ),
    (
        "kill_resume",
        ["benchmarks/kill_resume.py", "--kills", "20"],
        "20 SIGKILLs, resumed; bitwise equal to an uninterrupted run",
    ),
    (
        "task_overhead",
        ["benchmarks/task_overhead.py", "--baseline-rev", "a1cc4f4"],
        "default LM bench fp32 tokens/s before the task contract (a1cc4f4) vs now, interleaved (target within 3%)",
    ),
    (
        "bf16_updates",
        ["benchmarks/bf16_updates.py"],
        "bf16-true that keeps its updates: held-out loss gap to fp32, lost updates and bytes a parameter of "
        "adamw, adamw-sr and adamw-kahan (target on tiny: adamw-sr closes >= half of bf16-true's gap)",
    ),
    (
        "vs_hf_trainer",
        ["benchmarks/vs_hf_trainer.py"],
        "ampkit train vs transformers.Trainer, the same work checked (a random-init SmolLM2-135M-shaped Llama, "
        "4 of 30 layers; same batches, AdamW groups, LR, clipping, threads; first-step loss equal), fp32 and "
        "bf16-mixed, fresh processes alternated in pairs: Trainer / ampkit median steady-state step time "
        "(target >= 1.0) and ampkit / Trainer peak RSS",
    ),
    (
        "data_shards",
        ["benchmarks/data_shards.py", "--prepare-mib", "16"],
        "training from >= 1 GiB of token shards and from 4x that: peak anonymous memory (RssAnon, not the page "
        "cache; target under 1 GB both) over 200 steps of tiny, and `ampkit data prepare` tokens/s",
    ),
    (
        "data_share",
        ["benchmarks/data_share.py"],
        "the data share of the step (torch.profiler's data row: batch fetch and move) training from token shards "
        "vs the same corpus in memory, tiny, pack, seq 256 x 8",
    ),
    (
        "gpu_check_dry_run",
        ["benchmarks/gpu_check.py", "--dry-run", "--out", "benchmarks/results/gpu_check_dry_run.json"],
        "the GPU check's code paths, on CPU",
    ),
]


def machine_line() -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, platform; from ampkit.hardware import describe_device; "
            "i = describe_device(); print(f'{i.name} ({i.type}), torch {torch.__version__}, "
            "{torch.get_num_threads()} threads, Python {platform.python_version()}')",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return out.stdout.strip() or "unknown"


def run_one(name: str, argv: list[str]) -> tuple[int, str, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT)
    output = proc.stdout.strip() + ("\n" + proc.stderr.strip()[-2000:] if proc.returncode else "")
    return proc.returncode, output, time.perf_counter() - started


def existing_sections() -> dict[str, str]:
    """Sections already in docs/benchmarks.md, by benchmark name (kept when a run skips them)."""
    if not DOC.is_file():
        return {}
    parts = DOC.read_text().split("\n## ")[1:]
    return {part.split("\n", 1)[0].split(" ")[0]: "## " + part.rstrip() + "\n" for part in parts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--skip", default="")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    skip = set(filter(None, args.skip.split(",")))
    sections, failures, kept = [], 0, existing_sections()
    for name, argv, what in BENCHMARKS:
        if (only and name not in only) or name in skip or (not (ROOT / argv[0]).exists() and argv[0] != "-m"):
            if name in kept:
                sections.append(kept[name])  # measured by an earlier run; its command and date stay with it
            continue
        print(f"== {name}: {what}", flush=True)
        code, output, seconds = run_one(name, argv)
        print(output, flush=True)
        failures += code != 0
        status = "" if code == 0 else f" **(failed, exit {code})**"
        sections.append(
            f"## {name}{status}\n\n{what}. Command: `python {' '.join(argv)}` ({seconds:.0f} s, "
            f"{time.strftime('%Y-%m-%d')})\n\n"
            f"```\n{output}\n```\n"
        )
    DOC.write_text(
        "# Benchmarks\n\n"
        f"Written by `make bench` (`python benchmarks/run_all.py`) on {time.strftime('%Y-%m-%d %H:%M %Z')}.\n"
        f"Machine: {machine_line()}.\n"
        "Figures are ratios measured within one run; absolute numbers move with machine load.\n"
        "GPU figures come from `bash benchmarks/gpu_check.sh` on a lent GPU (its JSON lands in "
        "benchmarks/results/gpu_check.json); the `gpu_check_dry_run` section below is its CPU dry run only.\n\n"
        + "\n".join(sections)
    )
    print(f"wrote {DOC}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
