"""The foundation's acceptance runs, timed: `ampkit train --model tiny --precision fp32 --steps 300` on
the embedded corpus (target: under 3 minutes, held-out loss >= 40% below the first step's loss) and
`--precision fp16-mixed --steps 20` (reports its loss scale and skipped steps).

    python benchmarks/train_acceptance.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result


def run(*args: str) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "ampkit", "train", *args, "--out", f"{tmp}/run", "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(proc.stdout), time.perf_counter() - started


def main() -> int:
    fp32, fp32_s = run("--model", "tiny", "--precision", "fp32", "--steps", "300")
    fp16, fp16_s = run("--model", "tiny", "--precision", "fp16-mixed", "--steps", "20")
    drop = 1.0 - fp32["eval_loss"] / fp32["first_loss"]
    rows = [
        [
            "fp32, 300 steps",
            f"{fp32_s:.0f} s",
            f"{fp32['first_loss']:.3f}",
            f"{fp32['eval_loss']:.3f}",
            f"{drop:.1%}",
            f"{fp32['tokens_per_s']:,.0f}",
            "-",
            fp32["skipped_steps"],
        ],
        [
            "fp16-mixed, 20 steps",
            f"{fp16_s:.0f} s",
            f"{fp16['first_loss']:.3f}",
            f"{fp16['eval_loss']:.3f}",
            f"{1.0 - fp16['eval_loss'] / fp16['first_loss']:.1%}",
            f"{fp16['tokens_per_s']:,.0f}",
            f"{fp16['final_loss_scale']:g}",
            fp16["skipped_steps"],
        ],
    ]
    print("ampkit train on the embedded corpus, tiny model (wall time includes start-up)")
    print_table(["run", "wall", "first-step loss", "held-out loss", "drop", "tokens/s", "loss scale", "skipped"], rows)
    write_result(
        "train_acceptance",
        {
            "fp32_300": {
                "wall_s": fp32_s,
                "first_loss": fp32["first_loss"],
                "eval_loss": fp32["eval_loss"],
                "drop": drop,
            },
            "fp16_mixed_20": {
                "wall_s": fp16_s,
                "final_loss_scale": fp16["final_loss_scale"],
                "skipped_steps": fp16["skipped_steps"],
            },
        },
    )
    return 0 if fp32_s < 180 and drop >= 0.4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
