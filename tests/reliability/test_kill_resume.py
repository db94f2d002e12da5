"""The short kill test: 5 SIGKILLs at random moments (some during checkpoint writes), resumed each
time; the final losses equal an uninterrupted run's bitwise. The 20-kill run is
`python benchmarks/kill_resume.py --kills 20` (docs/reliability.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kill_resume.py"


def test_three_kills_resume_bitwise(tmp_path):
    out = tmp_path / "kill.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--kills", "3", "--steps", "30", "--json-out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["kills"] >= 3
    assert result["kills_during_checkpoint_write"] >= 1
    assert result["every_resume_loaded_latest_complete_checkpoint"] is True
    assert result["losses_bitwise_equal"] is True


@pytest.mark.slow
def test_two_kills_of_a_sharded_job_during_dcp_writes_resume_bitwise(tmp_path):
    """2 ranks (FSDP2 over gloo), DCP checkpoints: the whole job SIGKILLed while `step-N.dcp.tmp` is
    being written, twice; every resume loads the latest complete sharded checkpoint, and the final
    losses equal an uninterrupted 2-rank run's bitwise (`--sharded --kills 4` in docs/reliability.md)."""
    out = tmp_path / "kill.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sharded", "--kills", "2", "--steps", "14", "--json-out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["kills"] >= 2 and result["kills_during_checkpoint_write"] >= 1
    assert result["every_resume_loaded_latest_complete_checkpoint"] is True
    assert result["losses_bitwise_equal"] is True
