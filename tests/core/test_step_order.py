"""The loop's order of operations under fp16-mixed, proven with mocks that wrap the real calls:
scale -> backward -> unscale -> clip -> step -> update; clipping sees unscaled gradients."""

from __future__ import annotations

import copy
import weakref
from unittest import mock

import torch

import ampkit.core.step as loop
from ampkit.data import collate_pad
from ampkit.models import build_model, causal_lm_loss, get_preset
from ampkit.precision import build_precision
from ampkit.tasks.base import TensorBatch

CFG = get_preset("tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64)


class _OneBatch:
    def __init__(self, batch):
        self.batch = batch

    def next_batch(self):
        return self.batch


def _trainer(model, policy):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    units = [torch.randint(0, 256, (17,), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    sampler = _OneBatch(collate_pad(units))
    return loop.Trainer(
        model=model,
        policy=policy,
        optimizer=opt,
        scheduler=sched,
        sampler=sampler,
        device=torch.device("cpu"),
        grad_accum=1,
        clip_grad_norm=1.0,
    ), sampler.batch


def test_order_scale_backward_unscale_clip_step_update():
    model = build_model(CFG, seed=0)
    policy = build_precision("fp16-mixed", device_type="cpu")
    trainer, _ = _trainer(model, policy)
    calls = mock.Mock()
    scaler = policy.scaler
    calls.attach_mock(mock.patch.object(scaler, "scale", wraps=scaler.scale).start(), "scale")
    calls.attach_mock(mock.patch.object(scaler, "unscale_", wraps=scaler.unscale_).start(), "unscale")
    calls.attach_mock(mock.patch.object(scaler, "step", wraps=scaler.step).start(), "step")
    calls.attach_mock(mock.patch.object(scaler, "update", wraps=scaler.update).start(), "update")
    calls.attach_mock(mock.patch.object(loop, "clip_gradients", wraps=loop.clip_gradients).start(), "clip")
    model.embed.weight.register_hook(lambda g: (calls.backward(), None)[1])  # the last gradient backward makes
    scheduler_step = mock.patch.object(trainer.scheduler, "step", wraps=trainer.scheduler.step).start()
    calls.attach_mock(scheduler_step, "scheduler_step")
    try:
        result = trainer.train_step()
    finally:
        mock.patch.stopall()
    order = [c[0] for c in calls.mock_calls if "." not in c[0] and c[0]]
    assert order == ["scale", "backward", "unscale", "clip", "step", "update", "scheduler_step"]
    assert result.stepped


def test_clipping_sees_unscaled_gradients():
    model = build_model(CFG, seed=0)
    reference = copy.deepcopy(model)
    trainer, batch = _trainer(model, build_precision("fp16-mixed", device_type="cpu"))
    result = trainer.train_step()
    loss = causal_lm_loss(reference(batch.input_ids), batch.targets)
    loss.backward()
    fp32_norm = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()])
    assert trainer.policy.loss_scale() == 65536.0
    # A norm of scaled gradients would be ~65536x larger; fp16 autocast costs a little precision.
    torch.testing.assert_close(result.grad_norm, fp32_norm, rtol=2e-2, atol=0.0)


def test_skipped_step_does_not_advance_the_schedule():
    model = build_model(CFG, seed=0)
    trainer, _ = _trainer(model, build_precision("fp16-mixed", device_type="cpu"))
    overflowing = lambda logits, targets: causal_lm_loss(logits, targets) * float("inf")  # noqa: E731
    with mock.patch.object(loop, "causal_lm_loss", side_effect=overflowing):
        result = trainer.train_step()
    assert not result.stepped
    assert trainer.scheduler.last_epoch == 0
    assert trainer.policy.loss_scale() == 32768.0


def test_with_hysteresis_an_overflow_keeps_the_order_skips_the_step_and_holds_the_scale():
    from ampkit.precision import ScalerConfig

    model = build_model(CFG, seed=0)
    policy = build_precision("fp16-mixed", device_type="cpu", scaler=ScalerConfig(hysteresis=2))
    trainer, _ = _trainer(model, policy)
    calls = mock.Mock()
    scaler = policy.scaler
    for name in ("scale", "unscale_", "step", "update"):
        calls.attach_mock(mock.patch.object(scaler, name, wraps=getattr(scaler, name)).start(), name)
    overflowing = lambda logits, targets: causal_lm_loss(logits, targets) * float("inf")  # noqa: E731
    try:
        with mock.patch.object(loop, "causal_lm_loss", side_effect=overflowing):
            result = trainer.train_step()
    finally:
        mock.patch.stopall()
    assert [c[0] for c in calls.mock_calls if "." not in c[0]] == ["scale", "unscale_", "step", "update"]
    assert not result.stepped and trainer.scheduler.last_epoch == 0
    assert policy.loss_scale() == 65536.0 and scaler.overflows_in_row == 1  # held: the first of 2


def test_each_micro_batch_is_converted_once_before_its_forward_and_evaluation_too():
    policy = build_precision("bf16-true", device_type="cpu")
    with policy.init_context():
        model = torch.nn.Linear(4, 1)
    seen = []

    def loss_fn(model, batch):  # what the task's loss receives: bf16 inputs, its fp32 targets untouched
        seen.append((batch.inputs.dtype, batch.targets.dtype))
        outputs = model(batch.inputs)
        return torch.nn.functional.mse_loss(outputs.float(), batch.targets), outputs

    batch = TensorBatch(torch.randn(3, 4), torch.randn(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = loop.Trainer(
        model=model,
        policy=policy,
        optimizer=opt,
        scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
        sampler=_OneBatch(batch),
        device=torch.device("cpu"),
        grad_accum=2,
        clip_grad_norm=1.0,
        loss_fn=loss_fn,
        count_fn=lambda b: (3, 3),
    )
    calls = mock.Mock()
    calls.attach_mock(mock.patch.object(policy, "convert_input", wraps=policy.convert_input).start(), "convert")
    calls.attach_mock(mock.patch.object(policy, "forward_context", wraps=policy.forward_context).start(), "forward")
    try:
        result = trainer.train_step()
        trainer.evaluate([batch])
    finally:
        mock.patch.stopall()
    assert [c[0] for c in calls.mock_calls if "." not in c[0]] == ["convert", "forward"] * 3  # 2 micro-batches + eval
    assert seen == [(torch.bfloat16, torch.float32)] * 3 and torch.isfinite(result.loss)


def test_the_outputs_are_released_before_backward_and_the_optimizer_step():
    """The loop drops the task's outputs (logits, B*T*V) as soon as the loss is computed: only what
    autograd saved keeps them (the LM loss saves its logits until its own backward), so a micro-batch's
    logits are gone by the next one's backward and by the optimizer step (holding them raised the
    step's peak against transformers.Trainer). Seen through weak references at each phase."""
    outputs: list[weakref.ref] = []
    alive: list[tuple[str, list[bool]]] = []

    def loss_fn(model, batch):
        loss, logits = loop.forward_loss(model, batch)
        outputs.append(weakref.ref(logits))
        return loss, logits

    class Phases:
        def enter(self, phase: str) -> None:
            alive.append((phase, [ref() is not None for ref in outputs]))

    model = build_model(CFG, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    units = [torch.randint(0, 256, (17,), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    trainer = loop.Trainer(
        model=model,
        policy=build_precision("fp32", device_type="cpu"),
        optimizer=opt,
        scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
        sampler=_OneBatch(collate_pad(units)),
        device=torch.device("cpu"),
        grad_accum=2,
        clip_grad_norm=1.0,
        loss_fn=loss_fn,
        phases=Phases(),
    )
    result = trainer.train_step()
    assert alive == [("backward", [True]), ("backward", [False, True]), ("optimizer", [False, False])]
    assert result.stepped and torch.isfinite(result.loss)
