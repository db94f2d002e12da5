"""One rank of a 2-rank DDP job (gloo) lost in two ways, each the real thing:
- SIGKILLed mid-run (its pid found among the launcher's children by its RANK): the launcher ends the
  job in one line naming rank 1 and the signal, and `--resume` continues from the newest complete
  checkpoint to the same losses and final weights as an uninterrupted 2-rank run, bitwise;
- hung outside any collective (tests/distributed/inject/sitecustomize.py: its 3rd optimizer step
  sleeps): rank 0 times out after `--dist-timeout-s` at its next collective, and the launcher names
  rank 1 as the rank that hung.
Also: a resume at another world size is refused once, by the launcher, before any rank starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ampkit.distributed.checkpoint import list_sharded, read_sharded_model

STEPS = 16
DDP = ["--precision", "fp32", "--parallel", "ddp", "--steps", str(STEPS), "--checkpoint-every", "4"]


def _inject_path(here: Path) -> str:
    return os.pathsep.join(p for p in (str(here / "inject"), os.environ.get("PYTHONPATH", "")) if p)


def _rank_pid(launcher: int, rank: int, deadline: float) -> int:
    """The pid of `rank`: the launcher's child whose environment says RANK=rank (torchrun's protocol)."""
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{launcher}/task").glob("*"):
            for child in (task / "children").read_text().split():
                try:
                    environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if f"RANK={rank}".encode() in environ:
                    return int(child)
        time.sleep(0.01)
    raise AssertionError(f"rank {rank} never started")


def _final_weights(run_dir: Path) -> tuple[dict[str, torch.Tensor], int]:
    return read_sharded_model(list_sharded(run_dir)[-1], identity={})  # (weights, step)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, launch) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    proc = launch.ampkit("train", *launch.TINY, *DDP, "--nproc", "2", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_a_sigkilled_rank_is_named_and_the_resume_is_bitwise_the_uninterrupted_run(tmp_path, launch, reference):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "ampkit", "train", *launch.TINY, *DDP, "--nproc", "2", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        victim = _rank_pid(job.pid, 1, deadline)
        while not list_sharded(out) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # mid-run: after the first complete checkpoint (step 4 of 16)
        os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    killed_at = int(list_sharded(out)[-1].name[5:13])
    assert job.returncode == 1, err[-3000:]
    failed = [line for line in err.splitlines() if "distributed job failed" in line]
    named = failed[0].split("distributed job failed: ", 1)[1] if len(failed) == 1 else ""
    assert named.startswith("rank 1 was killed by SIGKILL;"), err[-3000:]  # the root cause first
    assert "Traceback" not in err
    assert killed_at < STEPS

    resumed = launch.ampkit("train", "--resume", str(out), "--nproc", "2", "--json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {killed_at}" in " ".join(resumed.stderr.split())  # the console may wrap the line
    assert launch.train_losses(out) == launch.train_losses(reference)  # every step's loss, bitwise
    (mine, step), (theirs, ref_step) = _final_weights(out), _final_weights(reference)
    assert step == ref_step == STEPS and mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_a_hung_rank_is_named_after_the_timeout(tmp_path, launch):
    hang = {"PYTHONPATH": _inject_path(launch.HERE), "AMPKIT_TEST_HANG_RANK": "1", "AMPKIT_TEST_HANG_STEP": "3"}
    started = time.monotonic()
    proc = launch.ampkit(
        "train",
        *launch.TINY,
        *DDP,
        "--dist-timeout-s",
        "5",
        "--nproc",
        "2",
        "--out",
        str(tmp_path / "run"),
        env=hang,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed = [line for line in proc.stderr.splitlines() if "distributed job failed" in line]
    assert len(failed) == 1, proc.stderr[-3000:]
    assert "rank 1 hung (rank 0 timed out after 5 s waiting for it" in failed[0]
    assert "rank 0: timed out waiting for another rank" in proc.stderr
    assert time.monotonic() - started < 100  # the timeout, not the 3600 s sleep, ended it


@pytest.mark.slow
def test_a_resume_at_another_world_size_is_refused_once_before_any_rank_starts(launch, reference):
    proc = launch.ampkit("train", "--resume", str(reference), "--nproc", "3")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "was written by 2 ranks and this job has 3" in lines[0], proc.stderr
    assert "resume with --nproc-per-node 2" in lines[0]


@pytest.mark.slow
def test_the_uninterrupted_runs_summary_and_report_have_each_ranks_step_time(reference):
    from ampkit.summaries import kind_of_summary

    summary = json.loads((reference / "summary.json").read_text())
    kind = kind_of_summary(summary)
    assert kind is not None and kind.name == "train" and not kind.validate(summary)
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["windows"] == STEPS - 2 and 0 < r["step_ms_median"] <= r["step_ms_p90"] for r in ranks)
    assert min(r["straggler"] for r in ranks) == 1.0 and all(r["straggler"] >= 1.0 for r in ranks)
    md = (reference / "report.md").read_text()
    assert "## Ranks" in md and f"| 1 | {ranks[1]['step_ms_median']:.1f} |" in md
