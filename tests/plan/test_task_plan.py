"""Planning any task: its own training step traced on fake tensors (no storage), the largest
micro-batch from two traces, checkpointing of the task's blocks."""

from __future__ import annotations

import torch

from ampkit.plan.config import PlanConfig
from ampkit.plan.setting import NO_RESERVE, StepSetting
from ampkit.plan.task_plan import _largest_batch, build_task_plan, task_ledger
from ampkit.tasks.builtin import builtin_task

KW = {"reserve": NO_RESERVE}


def _ledger(task, precision="fp32", **setting):
    step = StepSetting(precision=precision, micro_batch=8, **setting)
    batch = task.train_stream(batch_size=step.micro_batch, seed=0).next_batch()
    return task_ledger(task, step, batch=batch, **KW)


def test_the_traced_ledger_counts_weights_gradients_and_adam_states_of_the_tasks_model():
    task = builtin_task("mlp", hidden=32)
    ledger, flops = _ledger(task)
    n = sum(p.numel() for p in task.build_model(device=torch.device("cpu"), seed=0).parameters())
    assert ledger.at_peak["parameters"] == 4 * n  # fp32: 4 bytes a parameter
    assert ledger.largest["optimizer_states"] >= 2 * 4 * n  # exp_avg and exp_avg_sq
    assert flops and flops > 0


def test_checkpointing_the_convnets_blocks_saves_activations():
    task = builtin_task("convnet")
    plain, _ = _ledger(task)
    checkpointed, _ = _ledger(task, checkpointing="full")
    assert checkpointed.at_peak["activations"] < plain.at_peak["activations"]


def test_the_largest_micro_batch_is_read_off_two_traces():
    assert _largest_batch(8, 1000, 1800, 10_000) == 8 + 9000 // 100
    assert _largest_batch(8, 1000, 1000, 10_000) is None  # no growth with the batch: no bound from it


def test_a_task_plan_fits_a_gpu_and_skips_native_fp8():
    config = PlanConfig(task="mlp", gpu="A100-80GB", precisions="fp32,fp8", batch_size=8)
    plan = build_task_plan(config, builtin_task("mlp", hidden=16))
    assert plan["skipped"] == ["fp8"] and [r["setting"]["precision"] for r in plan["rows"]] == ["fp32"]
    assert plan["rows"][0]["fit"]["fits"] and plan["rows"][0]["compute"]["step_s_at_peak"] > 0


def test_a_true_precision_traces_the_tasks_model_in_its_dtype():
    """bf16-true and fp16-true (in plan's default precisions): weights built in the dtype, not cast after
    (casting a fake-tensor model used to fail: "Couldn't swap Linear.weight")."""
    task = builtin_task("mlp", hidden=32)
    n = sum(p.numel() for p in task.build_model(device=torch.device("cpu"), seed=0).parameters())
    for precision in ("bf16-true", "fp16-true"):
        ledger, _ = _ledger(task, precision=precision)
        assert ledger.at_peak["parameters"] == 2 * n  # 2 bytes a parameter
