"""Does the task contract cost the default language-model bench anything? The default `ampkit bench`
(fp32 only) of this checkout against another checkout (a git revision from before the contract),
interleaved round by round so drift and background load hit both alike; fp32 tokens/s ratio.

    python benchmarks/task_overhead.py --baseline-rev a1cc4f4 [--rounds 3] [--budget-s 8]

The baseline revision is checked out into a temporary git worktree; each run is a fresh
`python -m ampkit bench` process with PYTHONPATH pointing at that tree's `src/`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def bench_tokens_per_s(src: Path, out: Path, budget_s: float) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [
        sys.executable,
        "-m",
        "ampkit",
        "bench",
        "--precisions",
        "fp32",
        "--budget-s",
        str(budget_s),
        "--json",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=src.parent, timeout=900)
    if proc.returncode:
        raise SystemExit(f"bench failed in {src}:\n{proc.stderr[-2000:]}")
    timing = json.loads(proc.stdout)["precisions"][0]["timing"]
    return timing.get("items_per_s") or timing["tokens_per_s"]  # schema 2 / schema 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-rev", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=8.0)
    args = parser.parse_args()
    from common import print_table, write_result

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.baseline_rev], check=True
        )
        try:
            rows, new, old = [], [], []
            for i in range(args.rounds):
                old.append(bench_tokens_per_s(base / "src", Path(tmp) / f"old{i}", args.budget_s))
                new.append(bench_tokens_per_s(ROOT / "src", Path(tmp) / f"new{i}", args.budget_s))
                rows.append([f"round {i + 1}", f"{old[-1]:,.0f}", f"{new[-1]:,.0f}", f"{new[-1] / old[-1]:.3f}"])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    ratio = statistics.median(new) / statistics.median(old)
    rows.append(["median", f"{statistics.median(old):,.0f}", f"{statistics.median(new):,.0f}", f"{ratio:.3f}"])
    print(f"default LM bench, fp32 tokens/s: baseline {args.baseline_rev} vs this checkout ({args.budget_s:g} s each)")
    print_table(["", "baseline", "tasks", "ratio"], rows)
    write_result("task_overhead", {"baseline_rev": args.baseline_rev, "baseline": old, "tasks": new, "ratio": ratio})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
