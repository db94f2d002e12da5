"""Kill test: SIGKILL `ampkit train` at random moments (half of them while a checkpoint is being
written), resume each time, and check the final run equals an uninterrupted one bitwise (CPU, fp32).

    python benchmarks/kill_resume.py --kills 20            # the acceptance run (~2-3 min here)
    python benchmarks/kill_resume.py --kills 5 --quick     # the test-suite version
    python benchmarks/kill_resume.py --sharded --kills 4   # 2 ranks (FSDP2 over gloo), DCP checkpoints

`--sharded` trains with `--parallel fsdp --nproc 2`, whose checkpoints are DCP directories written by
both ranks; a kill takes the whole job down at once (the launcher and both ranks, as a lost node
does), the half aimed at checkpoint writes while `step-N.dcp.tmp` is being written.

Prints a table and writes benchmarks/results/kill_resume.json (or --json-out).
"""

from __future__ import annotations

import argparse
import json
import os
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
from ampkit.distributed.checkpoint import list_sharded
from ampkit.train.checkpoint import list_checkpoints

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
SHARDED_ARGS = ["--parallel", "fsdp", "--nproc", "2"]
RESUMED = re.compile(r"resuming .* at step (\d+)")


SHARDED = False  # set by --sharded


def _ampkit(*args: str) -> list[str]:
    extra = ["--nproc", "2"] if SHARDED and "--resume" in args else []
    return [sys.executable, "-m", "ampkit", "train", *args, *extra]


def _train_args() -> list[str]:
    return [*TRAIN_ARGS, *SHARDED_ARGS] if SHARDED else TRAIN_ARGS


def _train_losses(run_dir: Path) -> dict[int, float]:
    losses = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "train":
            losses[record["step"]] = record["loss"]
    return losses


def _latest_step(run_dir: Path) -> int | None:
    paths = list_sharded(run_dir) if SHARDED else list_checkpoints(run_dir)
    return int(paths[-1].name[5:13]) if paths else None  # step-00000010.pt / step-00000010.dcp


def _job(pid: int) -> list[int]:
    """`pid` and every process below it (torchrun starts each rank in a session of its own, so a
    process-group kill would miss them)."""
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            frontier += children
    return found


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the whole job at once: ranks first (deepest), then the launcher."""
    for pid in reversed(_job(proc.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _writing(folder: Path) -> bool:
    """A checkpoint is being written: a temporary file (step-N.pt.tmp) or DCP directory (step-N.dcp.tmp)."""
    try:
        return folder.is_dir() and any(p.suffix == ".tmp" for p in folder.iterdir())
    except OSError:  # the folder changed while listed
        return False


def _half_written(folder: Path) -> list[str]:
    """What a kill left of the checkpoint being written (sharded: step-N.dcp.tmp/ and the files in it)."""
    if not folder.is_dir():
        return []
    found = []
    for tmp in sorted(p for p in folder.iterdir() if p.suffix == ".tmp"):
        found.append(tmp.name + ("/" if tmp.is_dir() else ""))
        found += [f"{tmp.name}/{f.name}" for f in sorted(tmp.iterdir())] if tmp.is_dir() else []
    return found


def _kill_during_write(proc: subprocess.Popen, folder: Path, timeout_s: float, rng: random.Random) -> bool:
    """Poll for a checkpoint being written and SIGKILL the moment one is (sharded: at a random point
    of the ~0.1 s DCP write, so some kills fall before, some after the first rank's shards)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if _writing(folder):
            if SHARDED:
                time.sleep(rng.uniform(0.0, 0.05))
            _kill(proc)
            return _writing(folder) or not SHARDED
        time.sleep(0.0005)
    return False


def _one_cycle(run_dir: Path, steps: int, rng: random.Random, *, during_write: bool) -> dict:
    expected = _latest_step(run_dir)
    argv = (
        _ampkit("--resume", str(run_dir))
        if expected is not None
        else _ampkit(*_train_args(), "--steps", str(steps), "--out", str(run_dir))
    )
    if expected is None and run_dir.exists():
        shutil.rmtree(run_dir)  # killed before its first checkpoint: nothing to resume, start again
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    folder = run_dir / "checkpoints"
    start_step = expected or 0
    # Let the process make some progress first: wait for a checkpoint newer than where it started.
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline and (_latest_step(run_dir) or 0) <= start_step:
        time.sleep(0.01)
    hit_write = False
    if proc.poll() is None:
        if during_write:
            hit_write = _kill_during_write(proc, folder, timeout_s=5.0, rng=rng)
        if proc.poll() is None and not hit_write:
            time.sleep(rng.uniform(0.0, 0.4))
            _kill(proc)
    _, err = proc.communicate()
    resumed = RESUMED.search(err or "")
    return {
        "resumed_from": int(resumed.group(1)) if resumed else None,
        "expected_from": expected,
        "killed_during_write": hit_write,
        "left_half_written": _half_written(folder) if hit_write else [],
        "returncode": proc.returncode,
        "latest_after": _latest_step(run_dir),
    }


def run_campaign(kills: int, steps: int, seed: int, workdir: Path) -> dict:
    rng = random.Random(seed)
    ref, victim = workdir / "reference", workdir / "victim"
    subprocess.run(
        _ampkit(*_train_args(), "--steps", str(steps), "--out", str(ref)),
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
        "mode": "sharded (fsdp, 2 ranks, DCP)" if SHARDED else "single process",
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
    parser.add_argument("--sharded", action="store_true", help="2 ranks (--parallel fsdp --nproc 2), DCP checkpoints")
    parser.add_argument("--json-out", default=None, help="default: benchmarks/results/kill_resume[_sharded].json")
    args = parser.parse_args()
    global SHARDED
    SHARDED = args.sharded
    name = "kill_resume_sharded.json" if SHARDED else "kill_resume.json"
    args.json_out = args.json_out or str(Path(__file__).parent / "results" / name)
    if SHARDED:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # two ranks share the cores
    steps = args.steps or 8 * args.kills + 10
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_campaign(args.kills, steps, args.seed, Path(tmp))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(result, indent=2))
    ok = result["losses_bitwise_equal"] and result["every_resume_loaded_latest_complete_checkpoint"]
    print(
        f"{result['mode']}: kills survived: {result['kills']} "
        f"(during checkpoint writes: {result['kills_during_checkpoint_write']}), "
        f"resumes: {result['resumes']}, every resume loaded the latest complete checkpoint: "
        f"{result['every_resume_loaded_latest_complete_checkpoint']}, final losses bitwise equal to an "
        f"uninterrupted run over {steps} steps: {result['losses_bitwise_equal']}, wall {result['wall_s']} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
