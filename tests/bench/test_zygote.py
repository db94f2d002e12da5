"""bench/zygote.py: workers forked from one warm process behave as the processes they replace (real forks,
real signals, a real dead zygote)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from ampkit.bench import warm
from ampkit.bench.runner import run_worker
from ampkit.bench.zygote import Zygote, ZygoteGone


def test_a_forked_worker_writes_to_its_log_and_exits_with_its_code(tmp_path):
    log = tmp_path / "w.log"
    with Zygote(tmp_path / "zygote.log") as zygote, open(log, "w", encoding="utf-8") as stream:
        worker = zygote.start([], stream)  # no job: the worker's usage line on stderr, exit code 2
        assert worker.stdout.read() == ""  # EOF once the child ended: the parent holds no write end
        assert worker.wait(timeout=120) == 2
        assert worker.poll() == 2
    assert "usage: python -m ampkit.bench.worker JOB.json" in log.read_text(encoding="utf-8")
    assert zygote.proc is not None and zygote.proc.returncode == 0  # it ended when its socket closed


def test_a_killed_worker_reports_the_signal_and_the_zygote_forks_the_next(tmp_path):
    fifo = tmp_path / "job.json"
    os.mkfifo(fifo)  # the worker blocks reading its job: a real hung worker
    with Zygote(tmp_path / "zygote.log") as zygote:
        with open(tmp_path / "a.log", "w", encoding="utf-8") as stream:
            worker = zygote.start([str(fifo)], stream)
        assert worker.poll() is None
        worker.kill()
        assert worker.wait(timeout=120) == -signal.SIGKILL
        with open(tmp_path / "b.log", "w", encoding="utf-8") as stream:
            assert zygote.start(["a", "b"], stream).wait(timeout=120) == 2


def test_a_dead_zygote_falls_back_to_a_cold_worker(tmp_path):
    job, log = tmp_path / "job.json", tmp_path / "w.log"
    job.write_text("not json", encoding="utf-8")  # the cold worker fails reading it: it ran
    with Zygote(tmp_path / "zygote.log") as zygote:
        with open(tmp_path / "first.log", "w", encoding="utf-8") as stream:
            assert zygote.start([], stream).wait(timeout=120) == 2
        assert zygote.proc is not None
        zygote.proc.kill()
        zygote.proc.wait()
        with open(log, "w", encoding="utf-8") as stream, pytest.raises(ZygoteGone):
            zygote.start([str(job)], stream)
        death = run_worker(job, log, on_event=lambda event: None, timeout_s=300, zygote=zygote)
    assert death is None
    text = log.read_text(encoding="utf-8")
    assert "the warm process could not fork this worker" in text and "starting it cold" in text
    assert "JSONDecodeError" in text  # the cold worker's own traceback, after the fallback's line


def test_a_cpu_benchs_workers_are_forked_unless_told_not_to(real_runs, run_cli, tmp_path, monkeypatch):
    summary = json.loads((real_runs["bench"].run_dir / "summary.json").read_text(encoding="utf-8"))
    assert {entry["name"]: entry["budget"]["started"] for entry in summary["precisions"]} == {
        "fp32": "forked",
        "bf16-mixed": "forked",
    }
    monkeypatch.setenv("AMPKIT_BENCH_FORK", "0")
    argv = ["bench", "--precisions", "fp32", "--seq-len", "16", "--batch-size", "2", "--steps", "2"]
    code, _, err = run_cli(*argv, "--warmup-steps", "1", "--out", str(tmp_path / "cold"))
    assert code == 0, err
    cold = json.loads((tmp_path / "cold" / "summary.json").read_text(encoding="utf-8"))
    assert cold["precisions"][0]["budget"]["started"] == "cold"


def test_the_warm_process_ends_quietly_when_its_parent_left_before_it_was_ready():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with theirs:
        proc = subprocess.Popen(
            [sys.executable, "-m", warm.__name__, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stderr=subprocess.PIPE,
            text=True,
        )
    ours.close()  # gone before its imports are done: its "ready" meets a closed socket
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == ""
