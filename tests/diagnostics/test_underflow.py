"""The update-underflow meter (`ampkit.diagnostics.underflow`) and the source article's story: a LoRA
run whose adapters are stored in fp16 and whose gradients are tiny stops learning (its lora_A matrices
freeze: every update is below half an fp16 ulp, or flushed), and the meter names them with the fix; the
same run with fp32 adapters under fp16-mixed keeps every adapter moving."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampkit.core import Trainer, build_optimizer, build_scheduler
from ampkit.diagnostics.underflow import (
    UpdateUnderflowMeter,
    frozen_fix,
    layer_of_parameter,
    ulp,
)
from ampkit.lora import LoraSettings
from ampkit.lora.apply import apply_lora
from ampkit.precision import build_precision
from ampkit.tasks import SupervisedTask

LOSS_FACTOR = 1e-2
"""The task's loss is scaled down: tiny gradients (~1e-5 on the adapters), as in a long-sequence LoRA run."""


def test_ulp_and_half_ulp_rule():
    assert ulp(0.1, torch.float16) == 2.0**-14 and ulp(0.1, torch.float32) == 2.0**-27
    w = torch.tensor([0.1, 0.1], dtype=torch.float16)
    assert torch.equal(w + torch.tensor([3.0e-5, 3.2e-5]).half(), torch.tensor([0.1, 0.1 + 2**-14]).half())


def test_lost_updates_are_counted_per_layer():
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 1, bias=False)).half()
    with torch.no_grad():
        model[0].weight.fill_(0.1)
        model[1].weight.fill_(0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    meter = UpdateUnderflowMeter(model, optimizer, frozen_after=2).attach()
    for step in (1, 2):
        meter.begin_step(step)
        model[0].weight.grad = torch.full((4, 4), 1e-5, dtype=torch.float16)  # below half an ulp (3.05e-5)
        model[1].weight.grad = torch.full((1, 4), 1e-3, dtype=torch.float16)  # above it
        optimizer.step()
    stats = meter.drain()
    first = {layer.name: layer for layer in stats[0].layers}
    assert first["0"].lost_fraction == 1.0 and first["0"].unchanged_fraction == 1.0
    assert first["1"].lost_fraction == 0.0 and first["1"].unchanged_fraction == 0.0
    assert stats[0].lost_fraction == 16 / 20
    assert [f.name for f in meter.frozen] == ["0"] and meter.frozen[0].steps == 2
    meter.detach()
    assert not meter._handles


def test_skipped_steps_are_not_counted_and_every_arms():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = UpdateUnderflowMeter(model, optimizer, every=2).attach()
    meter.begin_step(1)
    optimizer.step()  # not armed: step 1 of every 2
    meter.begin_step(2)  # armed, but the scaler skips the step: optimizer.step() never runs
    meter.begin_step(4)
    model.weight.grad, model.bias.grad = torch.ones(2, 2), torch.ones(2)
    optimizer.step()
    assert [s.step for s in meter.drain()] == [4]


def test_a_fused_optimizers_skipped_step_is_not_counted():
    # torch's GradScaler calls a fused AdamW's step even when it skips (the kernel skips the update by
    # `found_inf`): the step's unchanged weights are no lost updates
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    meter = UpdateUnderflowMeter(model, optimizer).attach()
    x = torch.randn(8, 4)
    for step, factor in ((1, 1.0), (2, float("inf")), (3, 1.0)):
        meter.begin_step(step)
        optimizer.zero_grad()
        scaler.scale(model(x).pow(2).mean() * factor).backward()
        before = model.weight.detach().clone()
        scaler.step(optimizer)
        scaler.update()
        assert torch.equal(model.weight, before) == (step == 2)  # step 2 really skipped
    stats = meter.drain()
    assert [s.step for s in stats] == [1, 3] and all(s.lost_fraction == 0.0 for s in stats)


def test_layer_names_are_module_paths():
    assert layer_of_parameter("blocks.0.attn.q_proj.lora_A.default.weight") == "blocks.0.attn.q_proj.lora_A.default"
    assert layer_of_parameter("fc1.weight") == "fc1" and layer_of_parameter("scale") == "scale"


def test_fix_names_the_remedies():
    text = frozen_fix(dtype="float16", zero_grad_fraction=0.0, flush_fraction=0.0)
    assert text.startswith("store its weights in fp32: fp32 adapters")
    assert "bf16-mixed" in text and "larger loss scale" in text and "stochastic rounding" in text
    assert frozen_fix(dtype="float16", zero_grad_fraction=1.0, flush_fraction=0.0).startswith("bf16-mixed")
    assert "fp32 adapters" not in frozen_fix(dtype="float32", zero_grad_fraction=1.0, flush_fraction=0.0)


class TwoLayer(nn.Module):
    """Linear 32 -> 64 -> 4; inputs are cast to the weights' dtype (so fp16-true runs it in fp16)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 4)

    def forward(self, x):
        dtype = next(p.dtype for p in self.parameters())
        return self.fc2(F.gelu(self.fc1(x.to(dtype))))


def _tiny_gradient_loss(outputs, targets):
    return F.cross_entropy(outputs, targets) * LOSS_FACTOR


def _story(precision: str, adapter_dtype: torch.dtype, steps: int = 30) -> UpdateUnderflowMeter:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 32, generator=gen)
    y = x[:, :4].argmax(1)
    task = SupervisedTask(name="story", model=TwoLayer, loss_fn=_tiny_gradient_loss, train=(x, y), held=(x, y))
    policy = build_precision(precision, device_type="cpu")
    model = task.build_model(device=torch.device("cpu"), seed=0).half()  # the base in fp16, as --lora stores it
    apply_lora(model, LoraSettings(lora=4), precision=precision, seed=0, adapter_dtype=adapter_dtype)
    optimizer = build_optimizer(model, name="sgd", lr=1e-2, weight_decay=0.0)
    trainer = Trainer(
        model=model,
        policy=policy,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, warmup_steps=0, total_steps=steps, min_lr_ratio=1.0),
        sampler=task.train_stream(batch_size=32, seed=0),
        device=torch.device("cpu"),
        grad_accum=1,
        clip_grad_norm=0.0,
        loss_fn=task.loss,
        count_fn=task.count,
    )
    meter = UpdateUnderflowMeter(model, optimizer, frozen_after=10, scale_fn=policy.loss_scale).attach()
    with policy.run_context():
        for step in range(1, steps + 1):
            meter.begin_step(step)
            trainer.train_step()
    return meter


@pytest.mark.slow
def test_the_article_story_fp16_adapters_freeze_fp32_adapters_keep_moving():
    fp16 = _story("fp16-true", torch.float16)
    history = fp16.drain()
    frozen = {f.name: f for f in fp16.frozen}
    assert sorted(frozen) == ["fc1.lora_A.default", "fc2.lora_A.default"]  # named by module path
    for layer in frozen.values():
        assert layer.dtype == "float16" and layer.steps == 30 and layer.since_step == 1
        assert "fp32 adapters" in layer.fix
    last = {layer.name: layer for layer in history[-1].layers}
    assert last["fc1.lora_A.default"].lost_fraction > 0.5  # nonzero gradients whose updates rounded away
    fp32 = _story("fp16-mixed", torch.float32)
    steps = fp32.drain()
    assert fp32.frozen == []
    assert all(layer.unchanged_steps == 0 and layer.unchanged_fraction < 1 for layer in steps[-1].layers)
    assert steps[-1].scale == 65536.0  # fp16-mixed's loss scale keeps the fp16 backward from flushing
