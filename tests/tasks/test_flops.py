"""FLOPs per item for any task: measured with FlopCounterMode, and for the built-in language model
within 5% of the analytic 6N + attention count it uses for MFU."""

from __future__ import annotations

import pytest
import torch

from ampkit.models.flops import training_flops_per_token
from ampkit.precision import build_precision
from ampkit.tasks.builtin import builtin_task
from ampkit.tasks.encoder import make_encoder_task
from ampkit.tasks.flops import flops_per_item, measure_training_flops
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.mlp import TinyMLP

FP32 = build_precision("fp32", device_type="cpu")


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_the_language_models_measured_flops_agree_with_6n_plus_attention(model):
    task = LanguageModelTask(model=model, seq_len=128, batching="pack")  # full rows: every slot is computed
    net = task.build_model(device=torch.device("cpu"), seed=0)
    batch = task.example_batch(batch_size=2)
    flops, slots = measure_training_flops(task, net, batch, policy=FP32)
    analytic = training_flops_per_token(task.model_config, 128)
    assert flops / slots == pytest.approx(analytic, rel=0.05)
    assert flops_per_item(task, net, batch, batch_size=2, policy=FP32).source == "analytic"


def test_a_tasks_flops_are_measured_and_match_its_matmuls():
    task = builtin_task("mlp", hidden=64)
    assert isinstance(task.build_model(device=torch.device("cpu"), seed=0), TinyMLP)
    batch = task.held_out(batch_size=8, max_batches=1, seed=0)[0]
    counted = flops_per_item(
        task, task.build_model(device=torch.device("cpu"), seed=0), batch, batch_size=8, policy=FP32
    )
    # forward 2 x (128*64 + 64*10); backward: both products for fc2, only the weight gradient for fc1
    # (its input needs no gradient): 2 x 64*10 + 2 x 128*64 + 2 x 64*10
    expected = 2 * (128 * 64 + 64 * 10) + 2 * 128 * 64 + 4 * 64 * 10
    assert counted.source == "measured" and counted.value == expected


def test_measuring_moves_no_weight_and_leaves_no_gradient():
    task = make_encoder_task(n_layers=1)
    model = task.build_model(device=torch.device("cpu"), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = task.held_out(batch_size=4, max_batches=1, seed=0)[0]
    flops, slots = measure_training_flops(task, model, batch, policy=FP32)
    assert flops > 0 and slots == 4
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and model.training


def test_a_true_precisions_flops_are_measured_on_its_converted_inputs():
    # A bench sweep measures under its candidate's precision: bf16 weights need bf16 inputs.
    task = builtin_task("mlp", hidden=64)
    policy = build_precision("bf16-true", device_type="cpu")
    model = policy.convert_module(task.build_model(device=torch.device("cpu"), seed=0))
    batch = task.held_out(batch_size=8, max_batches=1, seed=0)[0]
    counted = flops_per_item(task, model, batch, batch_size=8, policy=policy)
    assert counted.value == 2 * (128 * 64 + 64 * 10) + 2 * 128 * 64 + 4 * 64 * 10  # the same matmuls as fp32's
