"""The parts a training run is made of, one at a time: cadence, throughput window, outcome, guard
choice, resume config and the builder's data checks."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from ampkit.errors import RunDiverged, TrainingError, UsageError
from ampkit.tasks import SupervisedTask
from ampkit.train.build import build_run_data
from ampkit.train.config import TrainConfig, resume_config
from ampkit.train.guard import NanGuard, StopOnDivergence, build_guard
from ampkit.train.loop import Cadence, RunStatus, ThroughputWindow, type_for


def test_cadence_logs_evaluates_and_checkpoints_on_their_steps():
    config = TrainConfig.of(steps=10, log_every=3, eval_every=4, checkpoint_every=5)
    cadence = Cadence(config, device=torch.device("cpu"), last_step=7)
    assert [s for s in range(1, 11) if cadence.logs(s)] == [3, 6, 7, 9]  # the last step of the invocation logs
    assert [s for s in range(1, 11) if cadence.evaluates(s)] == [4, 8]  # step 10 is the end: evaluated anyway
    assert [s for s in range(1, 11) if cadence.checkpoints(s)] == [5, 10]
    assert Cadence(TrainConfig(), device=torch.device("cuda"), last_step=1).log_every == 10  # CUDA: fewer syncs


def test_throughput_window_closes_on_the_steps_since_the_last_log():
    window = ThroughputWindow(torch.device("cpu"))
    window.add(100)
    window.add(300)
    seconds, steps, tokens = window.close()
    assert (steps, tokens) == (2, 400) and seconds >= 0
    assert window.timings[-1][1] == 200  # items per step
    window.add(5)
    window.restart()  # evaluation time: not step time, and its steps are dropped
    assert (window.steps, window.tokens) == (0, 0)


def test_each_outcome_has_its_exception_and_status_text():
    assert [s.value for s in RunStatus] == ["completed", "stopped", "failed", "diverged"]
    assert type_for(RunStatus.DIVERGED) is RunDiverged and type_for(RunStatus.FAILED) is TrainingError
    assert issubclass(RunDiverged, TrainingError)  # both exit 1


def test_without_guard_a_non_finite_loss_ends_the_run_naming_the_next_command():
    config = TrainConfig.of(batch_size=3, seq_len=16)
    guard = build_guard(config.guard, doctor_args=config.doctor_args(), checkpointer=None, run_dir=".")
    assert isinstance(guard, StopOnDivergence)
    result = SimpleNamespace(stepped=True)
    assert guard.check(result, {"loss": 2.0, "grad_norm": 1.0}) is None
    assert guard.check(result, None) is None  # off log steps nothing is read
    reason = guard.check(result, {"loss": math.nan, "grad_norm": 1.0})
    with pytest.raises(RunDiverged, match="at step 7.*ampkit doctor --model tiny --precision fp32 --batch-size 3"):
        guard.recover(None, step=7, reason=reason, metrics=None)


def test_with_guard_skips_in_a_row_and_applied_nan_gradients_trigger_a_rollback():
    config = TrainConfig.of(guard=True, checkpoint_every=2, guard_max_skips=2)
    guard = build_guard(config.guard, doctor_args=config.doctor_args(), checkpointer=None, run_dir=".")
    assert isinstance(guard, NanGuard)
    skipped = SimpleNamespace(stepped=False)
    assert guard.check(skipped, None) is None
    assert "2 consecutive steps skipped" in guard.check(skipped, None)
    applied = guard.check(SimpleNamespace(stepped=True), {"loss": 1.0, "grad_norm": math.inf})
    assert "non-finite gradient norm" in applied


def test_resume_config_refuses_a_change_that_would_not_match_the_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"steps": 10, "lr": 0.001, "scaler": {"init_scale": 1024.0}}))
    resumed = resume_config(tmp_path, {"steps": 20, "compile": False})  # steps and compile may change
    assert resumed.steps == 20 and resumed.optimizer.lr == 0.001 and resumed.scaler.init_scale == 1024.0
    with pytest.raises(UsageError, match="--lr cannot change when resuming"):
        resume_config(tmp_path, {"lr": 0.1})
    with pytest.raises(UsageError, match="missing does not exist"):
        resume_config(tmp_path / "missing", {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="is not an ampkit train run \\(no config.json\\)"):
        resume_config(tmp_path / "empty", {})


def test_a_task_without_held_out_data_is_refused_before_training():
    task = SupervisedTask(
        name="no-held-out",
        model=lambda: torch.nn.Linear(2, 2),
        loss_fn=torch.nn.functional.cross_entropy,
        train=(torch.randn(8, 2), torch.zeros(8, dtype=torch.long)),
    )
    with pytest.raises(UsageError, match="task no-held-out: held_out\\(\\) gave no batch"):
        build_run_data(TrainConfig.of(batch_size=4), task=task, parallel=SimpleNamespace(distributed=False))
