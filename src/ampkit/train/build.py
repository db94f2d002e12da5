"""Named builders for a run's objects, in the order data flows:
device check -> data (dedup, split, batching) -> precision policy -> model (meta device, checkpointing,
compile, FSDP2, materialisation, DDP: `build_run_model`) -> optimizer -> schedule.

The precision is checked against the device before any model is built, so an unsupported
precision costs nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from dataclasses import dataclass

import torch
from torch import nn

from ampkit.core import Trainer, build_optimizer, build_scheduler
from ampkit.core.optim import check_optimizer_available
from ampkit.data import DedupStats, Tokenizer, build_data, load_corpus
from ampkit.data.hf_tokenizer import tokenizer_for_model
from ampkit.distributed.context import LocalRun, init_run
from ampkit.distributed.sampler import RankShardedSampler
from ampkit.distributed.wrap import wrap_model
from ampkit.errors import UsageError
from ampkit.hardware import DeviceInfo, describe_device, pick_device
from ampkit.models import LlamaLM, ModelConfig, get_preset
from ampkit.models.hf import HFModelInfo, build_hf_model, describe_hf_model, is_hf_model
from ampkit.models.init import materialize
from ampkit.precision import Precision, build_precision, check_supported
from ampkit.train import features
from ampkit.train.checkpointer import FileCheckpointer, ShardedCheckpointer, build_checkpointer
from ampkit.train.config import TrainConfig
from ampkit.train.loggers import check_logger_available


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
    checkpointer: FileCheckpointer | ShardedCheckpointer
    """Single-file or sharded (DCP) checkpoints, chosen once with the parallel mode."""
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


def new_model(
    model_config: ModelConfig | HFModelInfo, *, device: torch.device, seed: int, policy: Precision | None = None
) -> nn.Module:
    """The model, constructed inside `policy.init_context()` (weights in their storage dtype: bf16 for
    bf16-true): a built-in preset on the meta device (no memory; `materialize` allocates and initialises
    it later), an `hf:PATH` model for real on `device` (transformers' seeded init or its weights)."""
    with policy.init_context() if policy is not None else contextlib.nullcontext():
        if isinstance(model_config, HFModelInfo):
            return build_hf_model(model_config.spec, device=device, seed=seed)
        with torch.device("meta"):
            return LlamaLM(model_config)


def instantiate_model(model_config: ModelConfig | HFModelInfo, *, device: torch.device, seed: int) -> nn.Module:
    """The model a resolved config describes, on `device`, fp32 weights; random init depends only on `seed`."""
    return materialize(new_model(model_config, device=device, seed=seed), device=device, seed=seed)


def build_run_model(
    model_config: ModelConfig | HFModelInfo,
    config: TrainConfig,
    *,
    policy: Precision,
    device: torch.device,
    parallel: LocalRun,
) -> tuple[nn.Module, features.FeatureReport]:
    """The run's model, built in torchtitan's order (meta init -> parallelize -> `to_empty` -> init): under
    bf16-true no fp32 copy of the model is made, and under FSDP2 the full model never exists on one rank.

    Preconditions: the precision was checked against the device (`check_device`); `policy` is the run's;
    `parallel` has joined the job and `device` is this rank's. Each step assumes the previous ones:
    1. `new_model` inside `policy.init_context()`: a preset on the meta device, weights in their storage
       dtype; an `hf:PATH` model for real (materialised on every rank, then sharded: no meta path for
       transformers' own init and loading).
    2. `policy.convert_module`: a no-op for *-true (already in dtype); fp8 swaps Linear layers (on meta too).
    3. activation checkpointing, then `torch.compile` (lazy: nothing is traced yet).
    4. FSDP2: `fully_shard` each block, then the root (on meta: shard metadata only).
    5. `materialize`: `to_empty(device)` + `init_weights(seed)`; under FSDP2 each rank writes its slice of
       the same full init, one parameter at a time (so 2 ranks start where one process does).
    6. the compile warm-up, timed (needs real weights; under FSDP2 it runs the sharded model).
    7. DDP (needs real weights: it checks them across ranks).
    The optimizer comes next, over the final parameters.
    """
    model = policy.convert_module(new_model(model_config, device=device, seed=config.seed, policy=policy))
    model, report = apply_model_features(model, config)
    fsdp = parallel.mode == "fsdp"
    if fsdp:
        model = wrap_model(model, run=parallel, spec=policy.spec, reduce_dtype=config.reduce_dtype)
    model = materialize(model, device=device, seed=config.seed)
    switches = config.features
    if switches.compile:
        example = features.synthetic_batch(
            batching=switches.batching, batch_size=config.batch_size, seq_len=config.seq_len
        )
        report.compile_s = features.warm_up_compiled(model, policy=policy, batch=example, device=device)
    if not fsdp:
        model = wrap_model(model, run=parallel, spec=policy.spec, reduce_dtype=config.reduce_dtype)
    return model, report


def apply_model_features(model: nn.Module, config: TrainConfig) -> tuple[nn.Module, features.FeatureReport]:
    """Checkpointing, then compile (lazy; `build_run_model` times its warm-up once the weights are real),
    on a model the policy already converted (on the meta device or real)."""
    switches = config.features
    features.check_batching_supported(model, switches.batching)
    blocks = features.apply_activation_checkpointing(model, spec=switches.activation_checkpointing)
    if switches.compile:
        features.compile_model(model, dynamic=None if switches.batching == "pack" else True)
    return model, features.FeatureReport(features=switches, checkpointed_blocks=blocks, compile_s=None)


def check_run_settings(config: TrainConfig, *, device: torch.device, model_config) -> None:
    """Everything that can be refused before any data or model work (UsageError with the fix)."""
    if config.seq_len > model_config.max_seq_len:
        raise UsageError(
            f"--seq-len {config.seq_len} exceeds model '{config.model}' max_seq_len "
            f"{model_config.max_seq_len}; use a shorter --seq-len"
        )
    if config.features.compile:
        features.check_compile_available(device)
    check_optimizer_available(config.features.optimizer)  # a missing library names its extra
    check_logger_available(config.log)


def build_run_data(config: TrainConfig, *, corpus, tokenizer, parallel):
    """The seeded training stream (dealt to the ranks of a data-parallel job) and held-out batches."""
    data = build_data(
        corpus,
        tokenizer,
        seq_len=config.seq_len,
        batch_size=config.batch_size,
        seed=config.seed,
        max_val_batches=config.eval_batches,
        strategy=config.features.batching,
        dedup=config.features.dedup,
    )
    sampler = data.train
    if parallel.distributed:  # rank r takes batches r, r+W, ... of the one seeded stream (global batch: W x)
        sharded = RankShardedSampler(sampler, rank=parallel.rank, world_size=parallel.world_size)
        parallel.sampler = sharded
        return data, sharded
    return data, sampler


def build_run(config: TrainConfig) -> RunObjects:
    device, info, warnings = check_device(config)
    # Joins the torchrun job before any data or model work; a rank's device is cuda:LOCAL_RANK.
    parallel, device = init_run(parallel=config.parallel, device=device, reduce_dtype=config.reduce_dtype)
    corpus = load_corpus(None if config.data == "default" else config.data)
    tokenizer = tokenizer_for_model(config.model)  # hf:PATH: the folder's own tokenizer if any; else bytes
    model_config = resolve_model_config(config.model, tokenizer)
    check_run_settings(config, device=device, model_config=model_config)
    data, sampler = build_run_data(config, corpus=corpus, tokenizer=tokenizer, parallel=parallel)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    policy = build_precision(config.precision, device_type=device.type, scaler=config.scaler)
    model, feature_report = build_run_model(model_config, config, policy=policy, device=device, parallel=parallel)
    optimizer = build_optimizer(model, name=config.features.optimizer, lr=config.lr, weight_decay=config.weight_decay)
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
        val_batches=data.val_batches,
        corpus_name=corpus.name,
        trainer=trainer,
        dedup=data.dedup,
        features=feature_report,
        parallel=parallel,
        checkpointer=build_checkpointer(config, parallel),
    )
