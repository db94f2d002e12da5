"""SIGINT/SIGTERM stop a run gracefully: finish the step, write a checkpoint, exit 128 + signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from ampkit.train.checkpoint import list_checkpoints, load_latest
from helpers import TINY_ARGS


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_gracefully_with_a_checkpoint(tmp_path, signum):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ampkit", "train", *TINY_ARGS, "--steps", "100000", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.is_file() or metrics.read_text().count('"train"') < 3):
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert "after writing a checkpoint" in err and "--resume" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert load_latest(out)["step"] == summary["steps"] >= 3
    assert len(list_checkpoints(out)) == 1
