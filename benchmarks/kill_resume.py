"""Kill test: SIGKILL `ampkit train` at random moments (half of them while a checkpoint is being
written), resume each time, and check the final run equals an uninterrupted one bitwise (CPU, fp32).

    python benchmarks/kill_resume.py --kills 20            # the acceptance run (~2-3 min here)
    python benchmarks/kill_resume.py --kills 5 --quick     # the test-suite version

Prints a table and writes benchmarks/results/kill_resume.json (or --json-out).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from ampkit.train.checkpoint import list_checkpoints  # noqa: E402

TRAIN_ARGS = [
    "--model",
    "tiny",
    "--seq-len",
    "32",
    "--batch-size",
    "4",
    "--warmup-steps",
    "2",
    "--eval-batches",
    "1",
    "--checkpoint-every",
    "1",
    "--keep-checkpoints",
    "2",
]
RESUMED = re.compile(r"resuming .* at step (\d+)")


def _ampkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "ampkit", "train", *args]


def _train_losses(run_dir: Path) -> dict[int, float]:
    losses = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "train":
            losses[record["step"]] = record["loss"]
    return losses


def _latest_step(run_dir: Path) -> int | None:
    paths = list_checkpoints(run_dir)
    return int(paths[-1].stem.split("-")[1]) if paths else None


def _kill_during_write(proc: subprocess.Popen, folder: Path, timeout_s: float) -> bool:
    """Poll for a temporary checkpoint file and SIGKILL the moment one exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if folder.is_dir() and any(p.suffix == ".tmp" for p in folder.iterdir()):
            proc.send_signal(signal.SIGKILL)
            return True
        time.sleep(0.0005)
    return False


def _one_cycle(run_dir: Path, steps: int, rng: random.Random, *, during_write: bool) -> dict:
    expected = _latest_step(run_dir)
    argv = (
        _ampkit("--resume", str(run_dir))
        if expected is not None
        else _ampkit(*TRAIN_ARGS, "--steps", str(steps), "--out", str(run_dir))
    )
    if expected is None and run_dir.exists():
        shutil.rmtree(run_dir)  # killed before its first checkpoint: nothing to resume, start again
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    folder = run_dir / "checkpoints"
    start_step = expected or 0
    # Let the process make some progress first: wait for a checkpoint newer than where it started.
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and (_latest_step(run_dir) or 0) <= start_step:
        time.sleep(0.01)
    hit_write = False
    if proc.poll() is None:
        if during_write:
            hit_write = _kill_during_write(proc, folder, timeout_s=5.0)
        if proc.poll() is None and not hit_write:
            time.sleep(rng.uniform(0.0, 0.4))
            proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    resumed = RESUMED.search(err or "")
    return {
        "resumed_from": int(resumed.group(1)) if resumed else None,
        "expected_from": expected,
        "killed_during_write": hit_write,
        "returncode": proc.returncode,
        "latest_after": _latest_step(run_dir),
    }


def run_campaign(kills: int, steps: int, seed: int, workdir: Path) -> dict:
    rng = random.Random(seed)
    ref, victim = workdir / "reference", workdir / "victim"
    subprocess.run(
        _ampkit(*TRAIN_ARGS, "--steps", str(steps), "--out", str(ref)),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cycles = []
    while len([c for c in cycles if c["returncode"] == -signal.SIGKILL]) < kills:
        cycle = _one_cycle(victim, steps, rng, during_write=len(cycles) % 2 == 0)
        cycles.append(cycle)
        if cycle["returncode"] == 0:  # finished before we could kill it: start a fresh victim
            shutil.rmtree(victim)
    final = subprocess.run(_ampkit("--resume", str(victim)), capture_output=True, text=True)
    if final.returncode != 0:
        raise SystemExit(f"final resume failed: {final.stderr.strip()}")
    resumes_ok = all(c["resumed_from"] == c["expected_from"] for c in cycles if c["expected_from"] is not None)
    ref_losses, victim_losses = _train_losses(ref), _train_losses(victim)
    return {
        "kills": sum(c["returncode"] == -signal.SIGKILL for c in cycles),
        "kills_during_checkpoint_write": sum(c["killed_during_write"] for c in cycles),
        "resumes": sum(c["expected_from"] is not None for c in cycles) + 1,
        "every_resume_loaded_latest_complete_checkpoint": resumes_ok,
        "steps": steps,
        "losses_bitwise_equal": ref_losses == victim_losses and len(ref_losses) == steps,
        "cycles": cycles,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default: 8 per kill + 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=str(Path(__file__).parent / "results" / "kill_resume.json"))
    args = parser.parse_args()
    steps = args.steps or 8 * args.kills + 10
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_campaign(args.kills, steps, args.seed, Path(tmp))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(result, indent=2))
    ok = result["losses_bitwise_equal"] and result["every_resume_loaded_latest_complete_checkpoint"]
    print(
        f"kills survived: {result['kills']} (during checkpoint writes: {result['kills_during_checkpoint_write']}), "
        f"resumes: {result['resumes']}, every resume loaded the latest complete checkpoint: "
        f"{result['every_resume_loaded_latest_complete_checkpoint']}, final losses bitwise equal to an "
        f"uninterrupted run over {steps} steps: {result['losses_bitwise_equal']}, wall {result['wall_s']} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
