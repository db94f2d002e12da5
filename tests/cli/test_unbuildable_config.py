"""A config.json transformers cannot build (a pad_token_id outside the vocabulary) is refused in one
line naming the file and transformers' reason, exit 2, by train, bench, doctor and plan."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ampkit.cli import main
from hf_archs import save_tiny

pytest.importorskip("transformers")

COMMANDS = {
    "train": ["--steps", "1"],
    "bench": ["--steps", "2", "--precisions", "fp32"],
    "doctor": [],
    "plan": [],
}


@pytest.fixture
def bad(tmp_path):
    return save_tiny(tmp_path / "bad", "llama", pad_token_id=300)  # the vocabulary has 256 ids


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_refused_in_one_line_exit_2(bad, tmp_path, capsys, command):
    code = main([command, "--model", f"hf:{bad}", *COMMANDS[command], "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert str(bad / "config.json") in err and "transformers cannot build" in err
    assert "Padding_idx must be within num_embeddings" in err  # transformers' own reason
    assert not (tmp_path / "run").exists() or command != "plan"


def test_the_command_line_says_one_line_on_stderr(bad, tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "ampkit", "plan", "--model", f"hf:{bad}", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ampkit plan: error:") and "pad_token_id" in lines[0], proc.stderr
