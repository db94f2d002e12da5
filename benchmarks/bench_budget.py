"""Does `ampkit bench` keep its budget? The whole command's wall time, start-up included, against its
promise: (budget x timed precisions + start-up + fidelity) x 1.2, and the acceptance figure of
`ampkit bench --model small --budget-s 5` (under 165 s on this CPU).

Runs the command in a fresh process (`python -m ampkit bench ...`), times it from the outside, and reads
its summary.json: measured steps and fidelity seconds come from the summary, start-up is the rest of
the outside wall time (interpreter, imports, checks, the matmul peaks, each worker's process, model and
warmup, the reports). Also prints each precision's plan (timed, few steps, reduced batch, not timed).
Writes benchmarks/results/bench_budget.json.

    python benchmarks/bench_budget.py [--model small] [--budget-s 5] [--limit-s 165]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result

BOUND_FACTOR = 1.2


def run_bench(model: str, budget_s: float, extra: list[str]) -> tuple[float, dict, str]:
    """(outside wall seconds, summary, the command's stderr tail)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench"
        argv = [sys.executable, "-m", "ampkit", "bench", "--model", model, "--budget-s", f"{budget_s:g}", *extra]
        started = time.perf_counter()
        proc = subprocess.run([*argv, "--out", str(out)], capture_output=True, text=True)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"ampkit bench failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return wall, json.loads((out / "summary.json").read_text()), proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--budget-s", type=float, default=5.0)
    parser.add_argument("--limit-s", type=float, default=165.0, help="the acceptance limit on the wall time")
    args, extra = parser.parse_known_args()
    load = os.getloadavg()
    wall, summary, _stdout = run_bench(args.model, args.budget_s, extra)
    budget = summary["budget"]
    measured, fidelity = budget["measured_s"], budget["fidelity_s"]
    startup = wall - measured - fidelity
    bound = BOUND_FACTOR * (args.budget_s * budget["timed_precisions"] + startup + fidelity)
    print(
        f"ampkit bench --model {args.model} --budget-s {args.budget_s:g} on {summary['device']['name']} "
        f"({summary['device']['cpu_threads']} threads; load average before {load[0]:.2f}): wall {wall:.0f} s "
        f"including start-up; expected up front ~{budget['expected_s'] or 0:.0f} s"
    )
    rows = []
    for entry in summary["precisions"]:
        plan, steps = entry["budget"], entry["steps"] or {}
        rows.append(
            [
                entry["name"],
                entry["status"],
                plan["mode"] + (", few steps" if plan["few_steps"] else ""),
                plan["batch_size"],
                f"{steps.get('warmup', '-')} + {steps.get('measured', '-')}",
                f"{plan['measured_s']:.1f}",
                f"{plan.get('fidelity_s') or 0:.1f}",
                (plan["reason"] or "")[:70],
            ]
        )
    print_table(["precision", "status", "plan", "batch", "warmup + measured", "measured s", "fidelity s", "why"], rows)
    print_table(
        [
            "measured steps s",
            "fidelity s",
            "start-up s",
            "bound s",
            "wall s",
            "within bound",
            f"under {args.limit_s:g} s",
        ],
        [
            [
                f"{measured:.1f}",
                f"{fidelity:.1f}",
                f"{startup:.1f}",
                f"{bound:.0f}",
                f"{wall:.0f}",
                wall <= bound,
                wall < args.limit_s,
            ]
        ],
    )
    path = write_result(
        "bench_budget",
        {
            "command": f"ampkit bench --model {args.model} --budget-s {args.budget_s:g} {' '.join(extra)}".strip(),
            "load_average_before": list(load),
            "load_average_after": list(os.getloadavg()),
            "wall_s": wall,
            "measured_s": measured,
            "fidelity_s": fidelity,
            "startup_s": startup,
            "bound_s": bound,
            "within_bound": wall <= bound,
            "limit_s": args.limit_s,
            "under_limit": wall < args.limit_s,
            "summary_budget": budget,
            "plans": {e["name"]: e["budget"] for e in summary["precisions"]},
            "recommendation": summary["recommendation"],
        },
    )
    print(f"-> {path}")
    return 0 if wall <= bound and wall < args.limit_s else 1


if __name__ == "__main__":
    raise SystemExit(main())
