"""A run whose numbers go non-finite stops (status "diverged", exit 1) at the first log step after it,
with the next command named, and never writes the non-finite state; no --guard involved."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ampkit.runs import read_metrics
from ampkit.train.checkpoint import list_checkpoints
from helpers import TINY_ARGS


def _run(run_cli, out, *extra):
    code, _, stderr = run_cli("train", *TINY_ARGS, "--out", str(out), "--json", *extra)
    summary = json.loads((out / "summary.json").read_text())
    train = [m for m in read_metrics(out / "metrics.jsonl") if m["event"] == "train"]
    return code, summary, train, stderr


@pytest.mark.parametrize("log_every", [1, 3])
def test_a_learning_rate_that_blows_up_ends_the_run_at_the_next_log_step(tmp_path, run_cli, log_every):
    out = tmp_path / f"lr-{log_every}"
    code, summary, train, stderr = _run(
        run_cli,
        out,
        "--steps",
        "12",
        "--lr",
        "1e30",
        "--warmup-steps",
        "0",
        "--log-every",
        str(log_every),
        "--checkpoint-every",
        "1",
    )
    assert code == 1 and summary["status"] == "diverged"
    assert "Traceback" not in stderr and "run diverged" in stderr
    # The run ended at a log step whose loss was non-finite; every earlier log step was finite.
    last = train[-1]
    assert not math.isfinite(last["loss"]) and summary["steps"] == last["step"]
    assert all(math.isfinite(r["loss"]) for r in train[:-1])
    assert last["step"] % log_every == 0 and last["step"] < 12
    line = stderr.strip().splitlines()[-1]
    assert f"at step {last['step']}" in line
    # checkpoints were written before the failing step: doctor --from replays exactly its batches
    assert list_checkpoints(out) and "--guard" in line
    assert f"ampkit doctor --from {out} (replays its last checkpoint's steps to step {last['step']})" in line
    for path in list_checkpoints(out):  # nothing non-finite was ever written
        state = torch.load(path, weights_only=True)
        assert all(bool(torch.isfinite(t).all()) for t in state["model"].values())
        assert state["step"] < last["step"]


def test_a_collapsed_loss_scale_ends_the_run_as_diverged(tmp_path, run_cli):
    out = tmp_path / "collapse"
    # Every backward overflows: 65536 -> 32768 (< min_scale 40000) at step 1.
    code, summary, _, stderr = _run(
        run_cli,
        out,
        "--steps",
        "6",
        "--precision",
        "fp16-mixed",
        "--min-scale",
        "40000",
        "--inject",
        "lm_head:backward:inf",
    )
    assert code == 1 and summary["status"] == "diverged"
    assert "loss scale collapsed" in stderr and "at step 1" in stderr and "Traceback" not in stderr
    assert list_checkpoints(out) == []


def test_a_healthy_run_is_not_called_diverged(tmp_path, run_cli):
    code, summary, train, _ = _run(run_cli, tmp_path / "ok", "--steps", "3")
    assert code == 0 and summary["status"] == "completed" and all(math.isfinite(r["loss"]) for r in train)


def test_a_run_with_no_checkpoint_names_the_doctor_command_of_its_step(tmp_path, run_cli):
    out = tmp_path / "no-checkpoint"
    code, summary, _, stderr = _run(run_cli, out, "--steps", "6", "--lr", "1e30", "--warmup-steps", "0")
    assert code == 1 and summary["status"] == "diverged" and not list_checkpoints(out)
    line = stderr.strip().splitlines()[-1]
    assert "ampkit doctor --model tiny --precision fp32 --batch-size 4 --seq-len 32" in line and "--from" not in line
