"""How fast `ampkit plan` answers: the analytic plan of a 70B model and a traced plan of 1B.

Targets (issue 5): `ampkit plan --model 70b --gpu H100-80GB` under 2 s; a traced plan of `1b` under
60 s and under 2 GiB of resident memory. Measured here:
- analytic, in process: `build_plan` (every precision x checkpointing row, fits, advice), median of
  repeated runs after imports;
- analytic, whole command: a fresh `python -m ampkit plan ... --json` process, wall time to the
  answer (the JSON on stdout, printed before the HTML report is drawn) and to exit;
- traced: a fresh process running `--trace` for one bf16-mixed configuration of `1b` at micro-batch 1
  x 2048 tokens; wall time and peak RSS of that child (`os.wait4`'s rusage, KiB on Linux); and the
  default plan of `1b` with `--trace` (7 precisions x 2 checkpointing modes, 12 of them traced).
Writes benchmarks/results/plan_speed.json. Run: .venv/bin/python benchmarks/plan_speed.py
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

from common import run_ampkit_json

RESULTS = Path(__file__).resolve().parent / "results" / "plan_speed.json"
ANALYTIC_ARGS = ["plan", "--model", "70b", "--gpu", "H100-80GB"]
TRACED_ARGS = [
    "plan",
    "--model",
    "1b",
    "--gpu",
    "A100-80GB",
    "--precisions",
    "bf16-mixed",
    "--checkpointing",
    "none",
    "--micro-batch",
    "1",
    "--seq-len",
    "2048",
    "--trace",
]
TRACED_ALL_ARGS = ["plan", "--model", "1b", "--gpu", "A100-80GB", "--trace"]  # every precision x checkpointing


def in_process(repeats: int = 5) -> dict:
    start = time.perf_counter()
    from ampkit.plan.config import PlanConfig
    from ampkit.plan.planner import build_plan

    imported = time.perf_counter() - start
    config = PlanConfig(model="70b", gpu="H100-80GB")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        summary = build_plan(config)
        times.append(time.perf_counter() - t0)
    return {
        "import_s": imported,
        "build_plan_s_median": statistics.median(times),
        "build_plan_s_runs": times,
        "rows": len(summary["rows"]),
    }


def run_command(args: list[str]) -> dict:
    """A fresh process (`common.run_ampkit_json`): time to the JSON answer and to exit, peak RSS, summary."""
    return {"argv": args, **run_ampkit_json(args)}


def main() -> None:
    analytic_cmd = [run_command(ANALYTIC_ARGS) for _ in range(3)]
    traced = run_command(TRACED_ARGS)
    traced_all = run_command(TRACED_ALL_ARGS)
    row = traced["summary"]["rows"][0]
    agreements = [r["agreement"] for r in traced_all["summary"]["rows"] if r["agreement"]]
    result = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "analytic_in_process": in_process(),
        "analytic_command": [{k: v for k, v in r.items() if k != "summary"} for r in analytic_cmd],
        "traced_command": {k: v for k, v in traced.items() if k != "summary"},
        "traced_all_command": {
            **{k: v for k, v in traced_all.items() if k != "summary"},
            "traced_rows": len(agreements),
            "largest_total_diff": max(abs(a["tensor_peak_relative"]) for a in agreements),
            "all_within_tolerance": all(a["within"] for a in agreements),
        },
        "traced_1b": {
            "analytic_total_gib": row["analytic"]["total_gib"],
            "traced_total_gib": row["traced"]["total_gib"],
            "tensor_peak_relative": row["agreement"]["tensor_peak_relative"],
            "within_tolerance": row["agreement"]["within"],
        },
        "targets": {"analytic_command_s": 2.0, "traced_command_s": 60.0, "traced_rss_gib": 2.0},
    }
    result["meets_targets"] = {
        "analytic_answer": min(r["answer_s"] for r in result["analytic_command"]) < 2.0,
        "traced_time": traced["exit_s"] < 60.0,
        "traced_rss": traced["max_rss_mib"] < 2048,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "analytic_in_process",
                    "analytic_command",
                    "traced_command",
                    "traced_all_command",
                    "traced_1b",
                    "meets_targets",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
