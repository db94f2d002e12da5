"""Tasks other than the language model through every command: train (exact resume, checkpointing,
guard, DDP/FSDP2 live in tests/distributed), bench, doctor and plan; and a task file written the way
a user would (examples/tasks/tinymlp.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ampkit.runs import read_metrics
from ampkit.train.checkpoint import list_checkpoints
from helpers import QUICK_TASK_BENCH as QUICK_BENCH
from helpers import train_losses as _losses

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "tasks" / "tinymlp.py") + ":make_task"


@pytest.mark.parametrize("task", ["mlp", "convnet", EXAMPLE])
def test_ten_steps_straight_equal_five_then_a_resume_of_five(tmp_path, run_cli, task):
    common = ["--task", task, "--steps", "10", "--batch-size", "8", "--warmup-steps", "2", "--eval-batches", "1"]
    assert run_cli("train", *common, "--out", str(tmp_path / "straight"), "--json")[0] == 0
    assert run_cli("train", *common, "--out", str(tmp_path / "split"), "--stop-after", "5", "--json")[0] == 0
    code, _, err = run_cli("train", "--resume", str(tmp_path / "split"), "--json")
    assert code == 0, err
    straight, split = _losses(tmp_path / "straight"), _losses(tmp_path / "split")
    assert sorted(split) == list(range(1, 11)) and split == straight  # bitwise: the same floats
    final = [
        torch.load(list_checkpoints(d)[-1], weights_only=True)["model"]
        for d in (tmp_path / "straight", tmp_path / "split")
    ]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])  # BatchNorm statistics included
    summary = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert summary["unit"] == "samples" and summary["items_per_s"] > 0 and summary["tokens_per_s"] is None


def test_activation_checkpointing_of_a_tasks_blocks_changes_no_number(tmp_path, run_cli):
    common = ["--task", "convnet", "--steps", "3", "--batch-size", "8", "--eval-batches", "1", "--json"]
    assert run_cli("train", *common, "--out", str(tmp_path / "plain"))[0] == 0
    assert run_cli("train", *common, "--activation-checkpointing", "full", "--out", str(tmp_path / "ckpt"))[0] == 0
    summary = json.loads((tmp_path / "ckpt" / "summary.json").read_text())
    assert summary["throughput"]["checkpointed_blocks"] == [0, 1, 2]
    plain, ckpt = _losses(tmp_path / "plain"), _losses(tmp_path / "ckpt")
    assert all(abs(plain[s] - ckpt[s]) < 1e-5 for s in plain)


def test_the_nan_guard_rolls_a_task_back(tmp_path, run_cli):
    out = tmp_path / "guarded"
    code, _, err = run_cli(
        "train",
        "--task",
        "mlp",
        "--steps",
        "6",
        "--batch-size",
        "8",
        "--eval-batches",
        "1",
        "--guard",
        "--checkpoint-every",
        "2",
        "--inject",
        "fc1:forward:nan@3",
        "--out",
        str(out),
        "--json",
    )
    assert code == 0, err
    rollbacks = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "rollback"]
    assert [(r["step"], r["to_step"]) for r in rollbacks] == [(3, 2)]


@pytest.mark.parametrize("task", ["mlp", EXAMPLE])
def test_bench_of_a_task_reports_samples_per_second_and_recommends(tmp_path, run_cli, task):
    out = tmp_path / "bench"
    code, stdout, err = run_cli(
        "bench", "--task", task, "--precisions", "fp32,bf16-mixed", *QUICK_BENCH, "--out", str(out), "--json"
    )
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["unit"] == "samples" and summary["recommendation"]["reason"]
    assert summary["model"]["flops_source"] == "measured" and summary["model"]["flops_per_item"] > 0
    assert all(e["timing"]["items_per_s"] > 0 for e in summary["precisions"])
    html = (out / "report.html").read_text()
    assert "samples/s" in html and "tokens/s" not in html


def test_doctor_names_an_injected_convolution_fault(tmp_path, run_cli):
    code, stdout, err = run_cli(
        "doctor",
        "--task",
        "convnet",
        "--precision",
        "fp16-mixed",
        "--inject",
        "blocks.0.conv1:backward:inf",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--smoke-steps",
        "4",
        "--no-fidelity",
        "--out",
        str(tmp_path / "d"),
        "--json",
    )
    assert code == 0, err
    summary = json.loads(stdout)
    first = summary["locator"]["scaler_overflows"][0] if summary["locator"]["scaler_overflows"] else None
    found = summary["locator"]["first_nonfinite"] or first
    assert (found["module"], found["phase"]) == ("blocks.0.conv1", "backward")
    assert summary["task"]["unit"] == "samples" and summary["model"]["preset"] == "convnet"


def test_doctor_runs_a_user_task_file(tmp_path, run_cli, cpu_kind):
    """Under both CPU kinds' facts: where bf16 is emulated (avx2), doctor's shorter defaults run fp32's smoke
    test only to convict a failing precision, so a passing bf16-mixed has no fp32 entry; where it is native
    (amx), both run."""
    code, stdout, err = run_cli(
        "doctor",
        "--task",
        EXAMPLE,
        "--precision",
        "bf16-mixed",
        "--steps",
        "3",
        "--smoke-steps",
        "30",
        "--out",
        str(tmp_path / "doctor"),
        "--json",
    )
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["smoke"]["bf16-mixed"]["passed"] and summary["model"]["preset"] == "tinymlp"
    assert summary["device"]["native_bf16"] == (cpu_kind == "amx")
    if cpu_kind == "amx":
        assert summary["smoke"]["fp32"]["passed"]
    else:
        assert "fp32" not in summary["smoke"]


def test_plan_runs_a_user_task_file(tmp_path, run_cli):
    code, stdout, err = run_cli(
        "plan",
        "--task",
        EXAMPLE,
        "--gpu",
        "A100-80GB",
        "--precisions",
        "fp32,bf16-mixed",
        "--micro-batch",
        "16",
        "--out",
        str(tmp_path / "plan"),
        "--json",
    )
    assert code == 0, err
    plan = json.loads(stdout)
    rows = plan["rows"]
    assert [r["setting"]["precision"] for r in rows] == ["fp32", "bf16-mixed"]  # no blocks: no checkpointing rows
    assert all(r["fit"]["fits"] and r["fit"]["max_micro_batch"] > 16 for r in rows)
    assert rows[0]["traced"]["lines_at_peak_bytes"]["parameters"] == 4 * (128 * 512 + 512 + 512 * 10 + 10)
    assert (tmp_path / "plan" / "report.html").is_file()
