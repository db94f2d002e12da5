"""Loss-scale hysteresis (DeepSpeed's meaning) on torch's GradScaler: K overflowing steps in a row
before a backoff, the count kept across a resume, and the clamp policy at the floor."""

from __future__ import annotations

import json

import torch

from ampkit.diagnostics.scale import ScaleTrajectory
from ampkit.precision import ScalerConfig, build_precision
from ampkit.precision.scaler import HysteresisGradScaler
from ampkit.runs import read_metrics
from ampkit.train.checkpoint import list_checkpoints
from helpers import TINY_ARGS


def _policy(**scaler):
    return build_precision("fp16-mixed", device_type="cpu", scaler=ScalerConfig(**scaler))


def _step(policy, param, optimizer, *, overflow: bool) -> bool:
    loss = (param * (float("inf") if overflow else 1.0)).sum()
    policy.backward(loss)
    policy.unscale_gradients(optimizer)
    stepped = policy.optimizer_step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return stepped


def _setup(**scaler):
    param = torch.nn.Parameter(torch.ones(4))
    return _policy(**scaler), param, torch.optim.SGD([param], lr=0.1)


def test_k_overflows_in_a_row_before_the_scale_backs_off():
    policy, param, optimizer = _setup(hysteresis=3)
    scales = []
    for _ in range(3):
        assert not _step(policy, param, optimizer, overflow=True)  # every overflowing step is skipped
        scales.append(policy.loss_scale())
    assert scales == [65536.0, 65536.0, 32768.0] and policy.scaler.overflows_in_row == 0
    assert _step(policy, param, optimizer, overflow=False)
    assert not _step(policy, param, optimizer, overflow=True) and policy.loss_scale() == 32768.0  # counts again


def test_hysteresis_one_is_torchs_grad_scaler():
    policy, param, optimizer = _setup()
    reference = torch.amp.GradScaler("cpu")
    mine = [(_step(policy, param, optimizer, overflow=o), policy.loss_scale()) for o in (True, False, True)]
    assert [s for _, s in mine] == [32768.0, 32768.0, 16384.0] and [st for st, _ in mine] == [False, True, False]
    assert isinstance(policy.scaler, HysteresisGradScaler) and reference.get_scale() == 65536.0


def test_the_overflow_count_survives_a_resume():
    policy, param, optimizer = _setup(hysteresis=2)
    _step(policy, param, optimizer, overflow=True)
    state = policy.state_dict()
    assert state["scaler"]["overflows_in_row"] == 1
    resumed, param2, optimizer2 = _setup(hysteresis=2)
    resumed.load_state_dict(state)
    assert not _step(resumed, param2, optimizer2, overflow=True) and resumed.loss_scale() == 32768.0


def test_the_clamp_policy_holds_the_floor_and_keeps_training():
    policy, param, optimizer = _setup(init_scale=4.0, min_scale=2.0, min_scale_policy="clamp")
    for _ in range(4):
        _step(policy, param, optimizer, overflow=True)
    assert policy.loss_scale() == 2.0  # never below the floor, no LossScaleCollapse


def test_the_trajectory_names_held_overflows():
    trajectory = ScaleTrajectory()
    trajectory.start(8.0)
    for step, (scale, stepped) in enumerate([(8.0, False), (4.0, False), (4.0, True)], start=1):
        trajectory.record(step, scale, stepped=stepped)
    assert [e.kind for e in trajectory.events] == ["held", "backoff"] and trajectory.summary()["held"] == 1


def test_train_holds_the_scale_on_a_single_overflow_and_checkpoints_the_count(tmp_path, run_cli):
    out = tmp_path / "run"
    code, _, err = run_cli(
        "train",
        *TINY_ARGS,
        "--precision",
        "fp16-mixed",
        "--steps",
        "4",
        "--hysteresis",
        "2",
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        "10",
        "--inject",
        "lm_head:backward:inf@3",
        "--out",
        str(out),
        "--json",
    )
    assert code == 0, err
    train = {r["step"]: r for r in read_metrics(out / "metrics.jsonl") if r["event"] == "train"}
    assert train[3]["skipped"] and train[3]["loss_scale"] == 65536.0 and not train[4]["skipped"]
    by_step = {torch.load(p, weights_only=True)["step"]: p for p in list_checkpoints(out)}
    assert torch.load(by_step[3], weights_only=True)["precision"]["scaler"]["overflows_in_row"] == 1
    assert torch.load(by_step[4], weights_only=True)["precision"]["scaler"]["overflows_in_row"] == 0
    assert json.loads((out / "summary.json").read_text())["config"]["scaler"]["hysteresis"] == 2
