"""Named builders for a run's objects, in the order data flows:
device check -> data (dedup, split, batching) -> model -> precision policy -> activation
checkpointing -> compile -> DDP / FSDP2 wrap (ampkit.distributed.wrap) -> optimizer -> schedule.

The precision is checked against the device before any model is built, so an unsupported
precision costs nothing.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch
from torch import nn

from ampkit.data import DedupStats, Tokenizer, build_data, load_corpus
from ampkit.data.hf_tokenizer import tokenizer_for_model
from ampkit.distributed.context import LocalRun, init_run
from ampkit.distributed.sampler import RankShardedSampler
from ampkit.distributed.wrap import wrap_model
from ampkit.errors import UsageError
from ampkit.hardware import DeviceInfo, describe_device, pick_device
from ampkit.models import ModelConfig, build_model, get_preset
from ampkit.models.hf import HFModelInfo, build_hf_model, describe_hf_model, is_hf_model
from ampkit.plan.fit_check import fit_check_for
from ampkit.precision import Precision, build_precision, check_supported
from ampkit.train import features
from ampkit.train.config import TrainConfig
from ampkit.train.loggers import check_logger_available
from ampkit.train.loop import Trainer
from ampkit.train.schedule import build_scheduler


@dataclass
class RunObjects:
    """Everything a training run holds; built by `build_run`."""

    config: TrainConfig
    device: torch.device
    device_info: DeviceInfo
    warnings: list[str]
    model_config: ModelConfig | HFModelInfo
    model: nn.Module
    policy: Precision
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: object
    val_batches: list
    corpus_name: str
    trainer: Trainer
    dedup: DedupStats | None = None
    """What `--dedup` removed before the split (mode "none": nothing)."""
    features: features.FeatureReport | None = None
    """The throughput switches applied (checkpointed blocks, compile time, ...)."""
    parallel: LocalRun = dataclasses.field(default_factory=LocalRun)
    """This process's place in a data-parallel job (`LocalRun`: a one-process run)."""

    def features_summary(self) -> dict:
        """The summary's "throughput" section: switches, compile time, optimizer-state bytes, dedup."""
        out = self.features.to_dict(self.optimizer) if self.features else {}
        out["dedup"] = self.dedup.to_dict() if self.dedup else None
        return out


def check_device(config: TrainConfig) -> tuple[torch.device, DeviceInfo, list[str]]:
    device = pick_device(config.device)
    info = describe_device(device)
    return device, info, check_supported(config.precision, info)


def resolve_model_config(model: str, tokenizer: Tokenizer) -> ModelConfig | HFModelInfo:
    """A preset's shape (its vocabulary sized to the tokenizer), or an `hf:PATH` model's description
    (counted on the meta device: no weights read); the tokenizer's ids must fit the HF vocabulary."""
    if not is_hf_model(model):
        return get_preset(model, vocab_size=tokenizer.vocab_size)
    info = describe_hf_model(model)
    if tokenizer.vocab_size > info.vocab_size:
        raise UsageError(
            f"--model {model}: the {tokenizer.name} tokenizer has {tokenizer.vocab_size} ids but the "
            f"model's vocabulary is {info.vocab_size}; raise vocab_size in config.json or save a "
            "matching tokenizer in the folder"
        )
    return info


def instantiate_model(model_config: ModelConfig | HFModelInfo, *, device: torch.device, seed: int) -> nn.Module:
    """The model a resolved config describes, on `device`, fp32 weights; random init depends only on `seed`."""
    if isinstance(model_config, HFModelInfo):
        return build_hf_model(model_config.spec, device=device, seed=seed)
    return build_model(model_config, device=device, seed=seed)


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """`config.optimizer` (adamw: fused AdamW; adamw-8bit; sgd); weight decay on matrices only."""
    return features.build_optimizer(model, name=config.optimizer, lr=config.lr, weight_decay=config.weight_decay)


def apply_model_features(
    model: nn.Module, config: TrainConfig, policy: Precision, device: torch.device
) -> tuple[nn.Module, features.FeatureReport]:
    """Checkpointing, then compile (with its warm-up timed), on a model the policy already converted."""
    features.check_batching_supported(model, config.batching)
    blocks = features.apply_activation_checkpointing(model, spec=config.activation_checkpointing)
    compile_s = None
    if config.compile:
        features.compile_model(model, dynamic=None if config.batching == "pack" else True)
        example = features.synthetic_batch(
            batching=config.batching, batch_size=config.batch_size, seq_len=config.seq_len
        )
        compile_s = features.warm_up_compiled(model, policy=policy, batch=example, device=device)
    report = features.FeatureReport(
        batching=config.batching,
        activation_checkpointing=config.activation_checkpointing,
        checkpointed_blocks=blocks,
        optimizer=config.optimizer,
        compile=config.compile,
        compile_s=compile_s,
    )
    return model, report


def build_run(config: TrainConfig) -> RunObjects:
    fit_check_for(config, device=pick_device(config.device), command="train")  # before anything is built
    device, info, warnings = check_device(config)
    # Joins the torchrun job before any data or model work; a rank's device is cuda:LOCAL_RANK.
    parallel, device = init_run(parallel=config.parallel, device=device, reduce_dtype=config.reduce_dtype)
    corpus = load_corpus(None if config.data == "default" else config.data)
    tokenizer = tokenizer_for_model(config.model)  # hf:PATH: the folder's own tokenizer if any; else bytes
    model_config = resolve_model_config(config.model, tokenizer)
    if config.seq_len > model_config.max_seq_len:
        raise UsageError(
            f"--seq-len {config.seq_len} exceeds model '{config.model}' max_seq_len "
            f"{model_config.max_seq_len}; use a shorter --seq-len"
        )
    if config.compile:
        features.check_compile_available(device)  # before any data or model work
    features.check_optimizer_available(config.optimizer)  # a missing library names its extra
    check_logger_available(config.log)
    data = build_data(
        corpus,
        tokenizer,
        seq_len=config.seq_len,
        batch_size=config.batch_size,
        seed=config.seed,
        max_val_batches=config.eval_batches,
        strategy=config.batching,
        dedup=config.dedup,
    )
    sampler, val_batches = data.train, data.val_batches
    if parallel.distributed:  # rank r takes batches r, r+W, ... of the one seeded stream (global batch: W x)
        sampler = parallel.sampler = RankShardedSampler(sampler, rank=parallel.rank, world_size=parallel.world_size)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    policy = build_precision(config.precision, device_type=device.type, scaler=config.scaler_config())
    model = policy.convert_module(instantiate_model(model_config, device=device, seed=config.seed))
    model, feature_report = apply_model_features(model, config, policy, device)
    model = wrap_model(model, run=parallel, spec=policy.spec, reduce_dtype=config.reduce_dtype)  # sharding last
    optimizer = build_optimizer(model, config, device)
    scheduler = build_scheduler(
        optimizer, warmup_steps=config.warmup_steps, total_steps=config.steps, min_lr_ratio=config.min_lr_ratio
    )
    trainer = Trainer(
        model=model,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        sampler=sampler,
        device=device,
        grad_accum=config.grad_accum,
        clip_grad_norm=config.clip_grad_norm,
        parallel=parallel,
    )
    return RunObjects(
        config=config,
        device=device,
        device_info=info,
        warnings=warnings,
        model_config=model_config,
        model=model,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        sampler=sampler,
        val_batches=val_batches,
        corpus_name=corpus.name,
        trainer=trainer,
        dedup=data.dedup,
        features=feature_report,
        parallel=parallel,
    )
