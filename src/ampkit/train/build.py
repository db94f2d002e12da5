"""Named builders for a run's objects, in the order data flows:
device check -> data -> model -> precision policy -> optimizer -> schedule.

The precision is checked against the device before any model is built, so an unsupported
precision costs nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.data import ByteTokenizer, build_samplers, load_corpus
from ampkit.hardware import DeviceInfo, describe_device, pick_device
from ampkit.models import ModelConfig, build_model, get_preset
from ampkit.precision import Precision, build_precision, check_supported
from ampkit.train.config import TrainConfig
from ampkit.train.loop import Trainer
from ampkit.train.schedule import build_scheduler


@dataclass
class RunObjects:
    """Everything a training run holds; built by `build_run`."""

    config: TrainConfig
    device: torch.device
    device_info: DeviceInfo
    warnings: list[str]
    model_config: ModelConfig
    model: nn.Module
    policy: Precision
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: object
    val_batches: list
    corpus_name: str
    trainer: Trainer


def check_device(config: TrainConfig) -> tuple[torch.device, DeviceInfo, list[str]]:
    device = pick_device(config.device)
    info = describe_device(device)
    return device, info, check_supported(config.precision, info)


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (norm gains and other vectors are not decayed).
    The fused kernel runs the whole update in one pass on CPU and CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def build_run(config: TrainConfig) -> RunObjects:
    device, info, warnings = check_device(config)
    corpus = load_corpus(None if config.data == "default" else config.data)
    tokenizer = ByteTokenizer()
    model_config = get_preset(config.model, vocab_size=tokenizer.vocab_size)
    if config.seq_len > model_config.max_seq_len:
        raise UsageError(f"--seq-len {config.seq_len} exceeds model '{config.model}' max_seq_len "
                         f"{model_config.max_seq_len}; use a shorter --seq-len")
    sampler, val_batches = build_samplers(corpus, tokenizer, seq_len=config.seq_len, batch_size=config.batch_size,
                                          seed=config.seed, max_val_batches=config.eval_batches)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    policy = build_precision(config.precision, device_type=device.type, scaler=config.scaler_config())
    model = policy.convert_module(build_model(model_config, device=device, seed=config.seed))
    optimizer = build_optimizer(model, config, device)
    scheduler = build_scheduler(optimizer, warmup_steps=config.warmup_steps, total_steps=config.steps,
                                min_lr_ratio=config.min_lr_ratio)
    trainer = Trainer(model=model, policy=policy, optimizer=optimizer, scheduler=scheduler, sampler=sampler,
                      device=device, grad_accum=config.grad_accum, clip_grad_norm=config.clip_grad_norm)
    return RunObjects(config=config, device=device, device_info=info, warnings=warnings, model_config=model_config,
                      model=model, policy=policy, optimizer=optimizer, scheduler=scheduler, sampler=sampler,
                      val_batches=val_batches, corpus_name=corpus.name, trainer=trainer)
