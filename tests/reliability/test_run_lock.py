"""One process per run directory: an advisory `flock` on RUN_DIR/.lock, released by the kernel when its
holder dies (so a SIGKILL never leaves a stale lock); a second process is refused at once, exit 2,
with the holder's pid and host. Real processes, real locks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampkit.runs import LOCK_FILE, lock_run_dir, read_metrics, release_run_dir
from helpers import TINY_ARGS, ampkit_process

REFUSED_WITHIN_S = 1.0


def _popen(*argv: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    return subprocess.Popen(
        [sys.executable, "-m", "ampkit", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"]


@pytest.fixture
def run_dir(tmp_path, run_cli) -> Path:
    out = tmp_path / "run"
    code, _, err = run_cli("train", *TINY_ARGS, "--steps", "2", "--checkpoint-every", "2", "--out", str(out))
    assert code == 0, err
    return out


def test_two_concurrent_resumes_exactly_one_runs(run_dir):
    resume = ("train", "--resume", str(run_dir), "--steps", "30", "--checkpoint-every", "5", "--json")
    started = time.monotonic()
    procs = [_popen(*resume), _popen(*resume)]
    ended: dict[int, float] = {}
    while len(ended) < 2 and time.monotonic() - started < 300:
        for i, proc in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.monotonic() - started
        time.sleep(0.005)
    outputs = [proc.communicate(timeout=60) for proc in procs]
    codes = sorted(proc.returncode for proc in procs)
    assert codes == [0, 2], outputs
    loser = next(i for i, proc in enumerate(procs) if proc.returncode == 2)
    winner = 1 - loser
    assert ended[loser] < REFUSED_WITHIN_S, ended  # from its start: refused before torch is even imported
    err = outputs[loser][1]
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"in use by pid {procs[winner].pid} on {socket.gethostname()}" in err
    assert "wait for it to finish or stop it" in err
    assert _train_steps(run_dir) == list(range(1, 31))  # every step exactly once
    assert not (run_dir / LOCK_FILE).exists()  # released (and removed) when the winner finished


def test_a_sigkilled_holder_leaves_no_stale_lock(run_dir):
    proc = _popen("train", "--resume", str(run_dir), "--steps", "100000", "--checkpoint-every", "5", "--json")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (len(_train_steps(run_dir)) < 6 or not (run_dir / LOCK_FILE).exists()):
        time.sleep(0.05)
    holder = json.loads((run_dir / LOCK_FILE).read_text())
    assert holder["pid"] == proc.pid and holder["host"] == socket.gethostname()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert (run_dir / LOCK_FILE).exists()  # the file stays; the kernel dropped the lock with the process
    again = _popen("train", "--resume", str(run_dir), "--steps", "12", "--json")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert json.loads(out)["steps"] == 12
    assert _train_steps(run_dir) == list(range(1, 13))


def test_commands_that_write_into_a_run_directory_are_refused_while_it_is_held(run_dir, tmp_path, run_cli):
    # the holder is this test process (an fd opened here); the refused commands run in-process and as
    # real processes (an flock is per open file, so this process's second open conflicts too)
    empty = tmp_path / "empty"
    empty.mkdir()
    lock_run_dir(run_dir, command="test")
    lock_run_dir(empty, command="test")
    try:
        for argv in (
            ["train", "--resume", str(run_dir)],
            ["report", str(run_dir)],
            ["train", *TINY_ARGS, "--steps", "1", "--out", str(empty)],
            ["plan", "--model", "7b", "--gpu", "A100-80GB", "--out", str(empty)],
            ["kv", "--model", "7b", "--gpu", "A100-80GB", "--out", str(empty)],
        ):
            proc = ampkit_process(*argv, timeout=120)
            assert proc.returncode == 2, (argv, proc.stderr)
            assert f"in use by pid {os.getpid()}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    finally:
        release_run_dir(run_dir)
        release_run_dir(empty)
    assert sorted(p.name for p in empty.iterdir()) == []  # nothing written, the lock file gone
    code, out, _ = run_cli("report", str(run_dir))  # free again: train's report re-rendered
    assert code == 0 and out.startswith(f"wrote {run_dir / 'report.html'}")


def test_a_lock_is_reentrant_in_its_process_and_removed_on_release(tmp_path):
    first = lock_run_dir(tmp_path, command="test")
    assert lock_run_dir(tmp_path, command="test") is first
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["command"] == "ampkit test"
    release_run_dir(tmp_path)
    assert not (tmp_path / LOCK_FILE).exists()
    again = lock_run_dir(tmp_path, command="test")  # a fresh lock after a release
    assert again is not first
    release_run_dir(tmp_path)


@pytest.mark.slow
def test_a_distributed_resume_is_refused_by_rank_0(tmp_path, run_cli):
    """`--nproc 2` resume of a held run: rank 0 refuses (before joining the job), the launcher stops
    rank 1, and the job exits 2."""
    out = tmp_path / "ddp"
    argv = ["train", *TINY_ARGS, "--steps", "2", "--parallel", "ddp", "--nproc", "2", "--out", str(out), "--json"]
    proc = ampkit_process(*argv, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lock_run_dir(out, command="test")
    try:
        proc = ampkit_process("train", "--resume", str(out), "--nproc", "2", "--steps", "4", timeout=300)
    finally:
        release_run_dir(out)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"in use by pid {os.getpid()}" in proc.stderr


def test_an_existing_out_suggests_resume_only_to_train(tmp_path):
    from ampkit.errors import UsageError
    from ampkit.runs import create_run_dir

    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(UsageError) as plan:
        create_run_dir(tmp_path, "plan")  # plan has no --resume
    assert str(plan.value).endswith("already exists and is not empty; choose another --out")
    with pytest.raises(UsageError, match=r"choose another --out \(or pass --resume to continue a training run\)"):
        create_run_dir(tmp_path, "train")
