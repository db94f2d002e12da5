"""Real signals to real `ampkit bench` and `ampkit doctor` processes (no mocks): the first precision (or
part) finishes, then SIGINT/SIGTERM. The run directory keeps what was measured (summary.json says
"interrupted"), the exit code is 128 + the signal, no log holds a traceback and no fidelity tensor is
left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampkit.bench.schema import validate_summary

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = ["--seq-len", "32", "--batch-size", "2", "--warmup-steps", "1"]
WAIT_S = 120.0  # hang protection only


def start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(tmp_path / "stderr.txt", "w", encoding="utf-8")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "ampkit", *args], stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=tmp_path
    )


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the process ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} after {WAIT_S:g} s")
        time.sleep(0.05)


def test_sigint_after_the_first_precision_keeps_what_was_measured(tmp_path):
    out = tmp_path / "run"
    args = ["bench", "--device", "cpu", "--precisions", "fp32,bf16-mixed", *TINY, "--steps", "3", "--out", str(out)]
    proc = start(args, tmp_path)
    # fp32 has finished once the parent writes bf16-mixed's job: its worker is starting (or importing torch)
    wait_for(lambda: (out / "workers" / "bf16-mixed.job.json").is_file(), proc, "bf16-mixed's job")
    assert (out / "workers" / "fp32.result.json").is_file()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # to the bench only (not its process group): it passes the stop on
    assert proc.wait(timeout=WAIT_S) == 130
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "interrupted by SIGINT during bf16-mixed (precisions finished: fp32)" in stderr
    assert "Traceback" not in stderr

    summary = json.loads((out / "summary.json").read_text())
    assert validate_summary(summary) == []
    assert summary["status"] == "interrupted"
    assert summary["interrupted"] == {"signal": "SIGINT", "during": "bf16-mixed", "finished": ["fp32"]}
    fp32, bf16 = summary["precisions"]
    assert fp32["status"] == "ok" and fp32["timing"]["items_per_s"] > 0 and fp32["fidelity"]["logits_cosine"] == 1.0
    assert bf16["status"] == "interrupted" and bf16["timing"] is None
    assert summary["recommendation"]["precision"] is None and "interrupted" in summary["recommendation"]["reason"]
    assert (out / "report.html").is_file() and (out / "config.json").is_file()

    for log in (out / "workers").glob("*.log"):
        text = log.read_text()
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, log.name
    assert "interrupted by SIGINT" in (out / "workers" / "bf16-mixed.log").read_text()
    assert list(out.rglob("*.pt")) == [] and list(out.rglob("*.tmp")) == []
    assert not (out / ".lock").exists()


def test_sigterm_during_the_smoke_test_writes_the_parts_doctor_finished(tmp_path):
    out = tmp_path / "run"
    args = ["doctor", "--steps", "2", "--batch-size", "1", "--seq-len", "16", "--smoke-steps", "5000"]
    args += ["--out", str(out)]
    proc = start(args, tmp_path)
    wait_for(lambda: "smoke test" in (tmp_path / "stderr.txt").read_text(), proc, "the smoke test")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT_S) == 128 + signal.SIGTERM
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "interrupted by SIGTERM during the smoke test" in stderr and "Traceback" not in stderr

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["advice"] == []
    assert summary["interrupted"] == {
        "signal": "SIGTERM",
        "during": "smoke test",
        "finished": ["range audit", "diagnostic run", "gradient snapshot"],
    }
    assert summary["run"]["steps"] == 2 and summary["gradients"]["scale_range"] is not None
    assert summary["fidelity"] is None
    config = json.loads((out / "config.json").read_text())  # like every run directory
    assert config == summary["config"] and config["steps"] == 2
    assert (out / "report.html").is_file()
