"""The contract over every precision x every built-in task, in-process through the Trainer: each
precision of the vocabulary (`ampkit.precision.table.SPECS`) runs two training steps of each built-in
task (`ampkit.tasks.builtin.BUILTIN_TASKS`) with a finite loss and its weights in their promised dtype
(a low-bit format refuses, in one line, a task with no Linear its shape rule admits); on a CPU, tf32 and
the native low-bit formats are what `check_supported` makes them (a refusal with the fix), and
tf32's policy, built anyway, changes no number of fp32's. Tiny shapes: emulated bf16/fp16 are slow on
an AVX2 CPU. The commands' CLI cases on a task live in tests/tasks/test_user_task.py."""

from __future__ import annotations

import pytest
import torch

from ampkit.core import build_trainer
from ampkit.errors import UsageError
from ampkit.hardware import describe_device
from ampkit.precision import SPECS, ConversionRefused, build_precision, check_supported
from ampkit.tasks.builtin import BUILTIN_TASKS, builtin_task

CPU = torch.device("cpu")
TINY = {  # a few thousand parameters each; 32-wide Linears, so every low-bit format converts some of them
    "mlp": {"features": 32, "hidden": 32, "train_size": 16, "held_size": 8},
    "convnet": {"widths": (4, 8, 8), "blocks_per_stage": 1, "image_size": 8, "train_size": 16, "held_size": 8},
    "encoder": {"d_model": 32, "n_heads": 2, "n_layers": 1, "seq_len": 8, "train_size": 16, "held_size": 8},
    "vlm": {
        **{"vision_width": 32, "vision_heads": 2, "vision_layers": 1, "d_model": 32, "n_heads": 2, "n_layers": 1},
        **{"image_size": 16, "train_size": 16, "held_size": 8},
    },
}
NOTHING_TO_CONVERT = {"convnet"}  # its one Linear is its 8 -> 10 head: no low-bit format's shape rule holds
REFUSED_ON_CPU = sorted(n for n, s in SPECS.items() if s.tf32 or s.native_low_bit)  # tf32, fp8, mxfp8, ...
RUNS_ON_CPU = sorted(set(SPECS) - set(REFUSED_ON_CPU))


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny shapes: one thread, no OpenMP fork/join per op (conftest's fixture restores the count)."""
    torch.set_num_threads(1)


def test_every_built_in_task_has_tiny_settings():
    assert set(TINY) == set(BUILTIN_TASKS)


def _two_steps(task_name: str, precision: str):
    """Two optimizer steps of the tiny task under `precision`, built as train builds it: the model
    inside the policy's init context, then converted."""
    task = builtin_task(task_name, **TINY[task_name])
    policy = build_precision(precision, device_type="cpu")
    with policy.init_context():
        model = task.build_model(device=CPU, seed=0)
    model = policy.convert_module(model)
    trainer = build_trainer(
        model,
        policy,
        task.train_stream(batch_size=4, seed=0),
        device=CPU,
        optimizer="adamw",
        lr=1e-3,
        weight_decay=0.0,
        warmup_steps=0,
        total_steps=2,
        min_lr_ratio=0.1,
        clip_grad_norm=1.0,
        loss_fn=task.loss,
        count_fn=task.count,
    )
    with policy.run_context():
        results = [trainer.train_step() for _ in range(2)]
    again = task.train_stream(batch_size=4, seed=0)
    assert [r.n_tokens for r in results] == [task.count(again.next_batch()).trained for _ in range(2)]  # 4 samples
    return model, results


@pytest.mark.parametrize("task_name", sorted(TINY))
@pytest.mark.parametrize("precision", RUNS_ON_CPU)
def test_two_steps_of_every_task_in_every_precision_have_a_finite_loss(task_name, precision):
    assert isinstance(check_supported(precision, describe_device(CPU)), list)  # runs here (perhaps emulated)
    if SPECS[precision].converts_linears and task_name in NOTHING_TO_CONVERT:
        with pytest.raises(ConversionRefused, match=f"^{precision} has nothing to convert in this model: ") as no:
            _two_steps(task_name, precision)
        assert "head: 8x10 not multiples of" in str(no.value) and "\n" not in str(no.value)
        return
    model, results = _two_steps(task_name, precision)
    assert all(r.loss.dtype == torch.float32 and torch.isfinite(r.loss) for r in results)
    assert all(torch.isfinite(r.grad_norm) for r in results)
    spec = SPECS[precision]
    assert {p.dtype for p in model.parameters()} == {spec.param_dtype}  # the step kept the weights' dtype


@pytest.mark.parametrize("precision", REFUSED_ON_CPU)
def test_tf32_and_native_fp8_are_refused_on_a_cpu_with_the_fix(precision):
    with pytest.raises(UsageError, match=f"{precision} needs .*: use ") as caught:
        check_supported(precision, describe_device(CPU))
    assert "\n" not in str(caught.value)


def test_tf32s_policy_is_a_no_op_on_a_cpu():
    _, fp32 = _two_steps("mlp", "fp32")
    _, tf32 = _two_steps("mlp", "tf32")
    assert [r.loss.item() for r in tf32] == [r.loss.item() for r in fp32]  # bitwise: the flags touch CUDA only
