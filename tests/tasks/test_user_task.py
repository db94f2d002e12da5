"""A user's own task through every command, the way a new user meets them: a recurrent regressor
(tests/tasks/gru_regressor.py, written from docs/tasks.md alone: a GRU over float sequences, MSE on
float targets) and `-true` precisions on tasks. One CLI case per command (train + resume, bench,
doctor, plan), in-process and tiny; a user's mistake is one line naming the task in each."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ampkit.diagnostics.smoke import SmokeConfig, run_smoke_test
from ampkit.precision import build_precision
from ampkit.runs import read_metrics
from ampkit.tasks import optional
from ampkit.tasks.load import load_task

GRU = str(Path(__file__).with_name("gru_regressor.py")) + ":make_task"
QUICK_BENCH = ["--budget-s", "0.3", "--min-steps", "2", "--max-steps", "4", "--warmup-steps", "1"]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny shapes: one thread, no OpenMP fork/join per op (conftest's fixture restores the count)."""
    torch.set_num_threads(1)


def _config(tmp_path: Path, task: str, **task_args) -> str:
    """A config file naming `task` with its [task] arguments (how the CLI passes a factory's keywords)."""
    lines = ["[task]", f"name = {json.dumps(task)}"] + [f"{k} = {json.dumps(v)}" for k, v in task_args.items()]
    path = tmp_path / f"{len(list(tmp_path.glob('*.toml')))}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("event") == "train"}


def test_train_bf16_true_on_the_mlp_task_works(tmp_path, run_cli):
    # Was: "task mlp: its loss failed on the first batch: RuntimeError: mat1 and mat2 must have the same dtype".
    config = _config(tmp_path, "mlp", features=16, hidden=32, train_size=16, held_size=8)
    common = ["--config", config, "--steps", "2", "--batch-size", "4", "--eval-batches", "1", "--json"]
    code, stdout, err = run_cli("train", "--precision", "bf16-true", *common, "--out", str(tmp_path / "run"))
    assert code == 0, err
    summary = json.loads(stdout)
    assert sorted(_losses(tmp_path / "run")) == [1, 2] and math.isfinite(summary["final_loss"])


def test_train_and_resume_a_recurrent_regressor_in_bf16_true(tmp_path, run_cli):
    # A GRU refuses fp32 input beside bf16 weights: the policy converts the inputs (never the targets).
    common = ["--task", GRU, "--precision", "bf16-true", "--steps", "2", "--batch-size", "4", "--eval-batches", "1"]
    assert run_cli("train", *common, "--out", str(tmp_path / "straight"), "--json")[0] == 0
    assert run_cli("train", *common, "--out", str(tmp_path / "split"), "--stop-after", "1", "--json")[0] == 0
    code, _, err = run_cli("train", "--resume", str(tmp_path / "split"), "--json")
    assert code == 0, err
    split = _losses(tmp_path / "split")
    assert sorted(split) == [1, 2] and split == _losses(tmp_path / "straight")  # bitwise: the same floats


def test_doctor_diagnoses_a_recurrent_regressor_in_bf16_true(tmp_path, run_cli):
    code, stdout, err = run_cli(
        "doctor", "--task", GRU, "--precision", "bf16-true", "--steps", "2", "--batch-size", "4",
        "--smoke-steps", "2", "--out", str(tmp_path / "doctor"), "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["task"]["classification"] is False and summary["task"]["train_samples"] == 160
    assert summary["fidelity"]["layers"] and summary["smoke"]  # per-layer fidelity ran on converted inputs
    # Scored on its loss (was: "token accuracy reached only 0.0%", an argmax over one output column).
    assert all("the loss did not fall to 1% of the first" in s["diagnosis"] for s in summary["smoke"].values())


def test_the_smoke_test_passes_a_regression_on_its_loss():
    task = load_task(GRU, {"hidden": 32})  # memorizes 16 samples in ~75 steps
    policy = build_precision("fp32", device_type="cpu")
    model = task.build_model(device=torch.device("cpu"), seed=0)
    batch = optional.smoke_batch(task, samples=16, seed=0)
    result = run_smoke_test(model, policy, batch, task=task, config=SmokeConfig(max_steps=200))
    assert result.passed and result.diagnosis.startswith("fp32: its loss fell to 1% of the first on 16 samples")
    assert result.accuracy[-1] == 1.0 and set(result.accuracy[:-1]) == {0.0}  # the score: loss <= 1% of the first


def test_plan_traces_a_recurrent_regressor_in_bf16_true(tmp_path, run_cli):
    code, stdout, err = run_cli(
        "plan", "--task", GRU, "--gpu", "A100-80GB", "--precisions", "fp32,bf16-true", "--micro-batch", "4",
        "--out", str(tmp_path / "plan"), "--json",
    )  # fmt: skip
    assert code == 0, err
    fp32, bf16 = json.loads(stdout)["rows"]
    parameters = [r["traced"]["lines_at_peak_bytes"]["parameters"] for r in (fp32, bf16)]
    assert parameters[0] == 2 * parameters[1] > 0 and bf16["setting"]["precision"] == "bf16-true"


def test_bench_never_recommends_a_batch_beyond_the_training_set(tmp_path, run_cli):
    code, stdout, err = run_cli(
        "bench", "--task", GRU, "--precisions", "fp32", *QUICK_BENCH, "--out", str(tmp_path / "bench"), "--json"
    )
    assert code == 0, err
    train = json.loads(stdout)["recommendation"]["train"]
    assert train["batch_size"] == 160 and "--batch-size 160" in train["command"]  # capped at the 160 rows


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--steps", "2"],
        ["doctor", "--precision", "fp32", "--steps", "2", "--smoke-steps", "2"],
        ["plan", "--gpu", "A100-80GB", "--precisions", "fp32"],
    ],
)
def test_a_mistake_in_a_users_model_is_one_line_naming_the_task(tmp_path, run_cli, command):
    config = _config(tmp_path, GRU, model_features=5)  # the model expects 5 features, the data has 4
    code, _, err = run_cli(*command, "--config", config, "--out", str(tmp_path / "run"))
    assert code == 2
    lines = err.strip().splitlines()
    assert "task gru-regressor: its " in lines[-1] and "Expected 5, got 4" in lines[-1]
    assert not any("Traceback" in line for line in lines)
