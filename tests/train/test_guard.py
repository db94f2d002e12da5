"""`train --guard`: a NaN burst is rolled back and skipped, the run completes, and no checkpoint on
disk ever holds a non-finite value. Plus the train-side diagnostics flags."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ampkit.diagnostics.train_hooks import NoDiagnostics, build_train_diagnostics
from ampkit.runs import read_metrics
from ampkit.train import TrainConfig, build_run
from ampkit.train.checkpoint import list_checkpoints
from ampkit.train.checkpointer import local_state_is_finite
from helpers import TINY_ARGS

ARGS = [*TINY_ARGS, "--eval-batches", "1", "--checkpoint-every", "2", "--keep-checkpoints", "100"]


def _all_finite(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, dict):
        return all(_all_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_all_finite(v) for v in obj)
    return not isinstance(obj, float) or math.isfinite(obj)


def _scan_checkpoints(run_dir: Path) -> list[int]:
    """Every checkpoint on disk, fully loaded: weights and optimizer state must be finite."""
    steps = []
    for path in list_checkpoints(run_dir):
        state = torch.load(path, map_location="cpu", weights_only=True)
        assert _all_finite(state["model"]), f"{path.name} holds non-finite weights"
        assert _all_finite(state["optimizer"]), f"{path.name} holds non-finite optimizer state"
        steps.append(state["step"])
    return steps


def _train(run_cli, out: Path, *extra: str):
    code, _stdout, stderr = run_cli("train", *ARGS, "--out", str(out), "--json", *extra)
    summary = json.loads((out / "summary.json").read_text())
    return code, summary, read_metrics(out / "metrics.jsonl"), stderr


def test_guard_survives_a_nan_burst(tmp_path, run_cli):
    out = tmp_path / "guarded"
    code, summary, metrics, stderr = _train(
        run_cli, out, "--steps", "10", "--guard", "--inject", "blocks.1.mlp:forward:nan@5-6"
    )
    assert code == 0, stderr
    assert summary["status"] == "completed" and summary["steps"] == 10
    rollbacks = [m for m in metrics if m["event"] == "rollback"]
    assert [(r["step"], r["to_step"]) for r in rollbacks] == [(5, 4), (5, 4)]  # 2 bad batches, each skipped
    assert all("non-finite loss" in r["reason"] for r in rollbacks)
    assert summary["guard"]["rollbacks"] == 2 and summary["diagnostics"]["inject"]["fired_steps"] == [5, 6]
    train = [m for m in metrics if m["event"] == "train"]
    assert math.isfinite(train[-1]["loss"]) and train[-1]["step"] == 10
    first_pass_lr = next(m["lr"] for m in train if m["step"] == 5)
    after = [m for m in train if m["step"] == 5][-1]  # step 5 again, after two rollbacks
    assert after["lr"] == pytest.approx(first_pass_lr * 0.25)  # cut by 0.5 per rollback
    assert _scan_checkpoints(out) == [0, 2, 4, 6, 8, 10]


def test_without_guard_a_nan_loss_ends_the_run_as_diverged(tmp_path, run_cli):
    out = tmp_path / "unguarded"
    code, summary, metrics, stderr = _train(run_cli, out, "--steps", "6", "--inject", "blocks.1.mlp:forward:nan@3")
    assert code == 1 and summary["status"] == "diverged" and summary["guard"] == {"enabled": False}
    assert summary["steps"] == 3 and not math.isfinite(summary["final_loss"])
    last_line = stderr.strip().splitlines()[-1]
    assert "at step 3" in last_line and f"ampkit doctor --from {out} " in last_line  # its step-2 checkpoint
    assert "--guard" in last_line and "Traceback" not in stderr
    assert max(m["step"] for m in metrics if m["event"] == "train") == 3
    assert _scan_checkpoints(out) == [2]  # the diverged state is never written


def test_non_finite_weights_never_reach_disk(tmp_path, run_cli):
    # fp32 applies the nan gradients of step 3; the loss is read (and found nan) only at the log
    # step 5, so the checkpoint at step 4 meets non-finite weights: it is skipped, not written.
    out = tmp_path / "nan-weights"
    code, summary, metrics, _ = _train(
        run_cli, out, "--steps", "8", "--log-every", "5", "--inject", "blocks.1.mlp:backward:nan@3"
    )
    assert code == 1 and summary["status"] == "diverged" and summary["steps"] == 5
    assert [m["step"] for m in metrics if m["event"] == "checkpoint_skipped"] == [4]
    assert _scan_checkpoints(out) == [2]


def test_guard_rolls_back_on_consecutive_skips_and_scale_collapse(tmp_path, run_cli):
    out = tmp_path / "fp16"
    code, summary, metrics, stderr = _train(
        run_cli,
        out,
        "--steps",
        "8",
        "--precision",
        "fp16-mixed",
        "--guard",
        "--guard-max-skips",
        "2",
        "--min-scale",
        "20000",
        "--inject",
        "lm_head:backward:inf@3-4",
    )
    assert code == 0, stderr
    reasons = [m["reason"] for m in metrics if m["event"] == "rollback"]
    # skip at step 3 (65536 -> 32768), skip at step 4 (-> 16384 < min_scale 20000): a collapse
    assert len(reasons) == 1 and "loss scale collapse" in reasons[0]
    assert summary["status"] == "completed" and summary["final_loss_scale"] >= 20000
    _scan_checkpoints(out)
    out2 = tmp_path / "fp16-skips"
    code, summary, metrics, stderr = _train(
        run_cli,
        out2,
        "--steps",
        "8",
        "--precision",
        "fp16-mixed",
        "--guard",
        "--guard-max-skips",
        "2",
        "--inject",
        "lm_head:backward:inf@3-4",
    )
    assert code == 0, stderr
    [rollback] = [m for m in metrics if m["event"] == "rollback"]
    assert "2 consecutive steps skipped" in rollback["reason"] and rollback["to_step"] == 2


def test_guard_gives_up_with_a_clear_report(tmp_path, run_cli):
    out = tmp_path / "hopeless"
    code, summary, _metrics, stderr = _train(
        run_cli, out, "--steps", "8", "--guard", "--guard-max-rollbacks", "2", "--inject", "norm:forward:inf"
    )
    assert code == 1
    assert "NaN guard gave up after 2 rollbacks" in stderr and "ampkit doctor" in stderr
    assert summary["status"] == "failed" and summary["guard"]["rollbacks"] == 2
    assert _scan_checkpoints(out) == [0]


def test_guard_needs_checkpoints(run_cli, tmp_path):
    code, _, stderr = run_cli("train", *TINY_ARGS, "--guard", "--out", str(tmp_path / "x"))
    assert code == 2 and "--checkpoint-every" in stderr


def test_local_state_is_finite():
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert local_state_is_finite(model, optimizer)
    optimizer.state[model.weight]["exp_avg_sq"][0, 0] = math.inf
    assert not local_state_is_finite(model, optimizer)
    optimizer.state[model.weight]["exp_avg_sq"][0, 0] = 0.0
    with torch.no_grad():
        model.bias[1] = math.nan
    assert not local_state_is_finite(model, optimizer)


def test_grad_stats_and_nonfinite_detection_in_train(tmp_path, run_cli):
    out = tmp_path / "diag"
    code, summary, metrics, stderr = _train(
        run_cli,
        out,
        "--steps",
        "4",
        "--grad-stats-every",
        "2",
        "--detect-nonfinite",
        "--inject",
        "blocks.2.attn.o_proj:backward:inf@3",
    )
    # fp32 applies step 3's inf gradients; step 4's loss is nan: the run ends there as diverged,
    # after its log-step diagnostics were written.
    assert code == 1 and summary["status"] == "diverged" and summary["steps"] == 4, stderr
    stats = [m for m in metrics if m["event"] == "grad_stats"]
    assert [s["step"] for s in stats] == [2, 4] and stats[0]["scale"] == 1.0
    layers = {layer["name"]: layer for layer in stats[0]["layers"]}
    assert {"embed", "blocks.0", "blocks.3", "norm"} <= set(layers)
    assert all(math.isfinite(layer["norm"]) and 0 <= layer["flush_fraction"] <= 1 for layer in layers.values())
    assert len(stats[0]["tensors"]) == len(
        list(
            torch.nn.Module.parameters(
                build_run(TrainConfig.of(model="tiny", seq_len=32, batch_size=2, eval_batches=1)).model
            )
        )
    )
    [found] = [m for m in metrics if m["event"] == "nonfinite"]
    assert (found["module"], found["phase"], found["step"]) == ("blocks.2.attn.o_proj", "backward", 3)
    assert summary["diagnostics"]["first_nonfinite"]["module"] == "blocks.2.attn.o_proj"


def test_diagnostics_off_places_no_hooks():
    objs = build_run(TrainConfig.of(model="tiny", seq_len=32, batch_size=2, eval_batches=1))
    diagnostics = build_train_diagnostics(objs, objs.config.guard, micro_batches=objs.config.grad_accum)
    assert isinstance(diagnostics, NoDiagnostics) and diagnostics.summary() == {}
    assert all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks) for m in objs.model.modules())
    assert all(not p._post_accumulate_grad_hooks for p in objs.model.parameters())
