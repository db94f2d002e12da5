"""Named builders for a run's objects, in the order data flows:
device check -> task (`ampkit.tasks`: the model and data it names) -> data (seeded streams, held-out
batches) -> precision policy -> model (meta device, checkpointing, compile, FSDP2, materialisation,
DDP: `build_run_model`) -> first-batch check of a user's task -> optimizer -> schedule.

The precision is checked against the device before any model is built, so an unsupported
precision costs nothing. Nothing here knows a model family: the task builds the model, streams the
batches and computes the loss.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ampkit.core import Trainer
from ampkit.core.optim import check_optimizer_available
from ampkit.core.step import build_trainer
from ampkit.diagnostics.optim_states import train_warnings
from ampkit.distributed.context import LocalRun, init_run
from ampkit.distributed.sampler import RankShardedSampler
from ampkit.distributed.wrap import reshard, wrap_model
from ampkit.errors import UsageError
from ampkit.hardware import DeviceInfo, describe_device, pick_device
from ampkit.hardware.gpus import GPUS
from ampkit.lora.build import build_lora_model, check_lora_available
from ampkit.models.init import materialize
from ampkit.precision import Fp8Options, Precision, build_precision, check_supported
from ampkit.precision.fp8_roofline import Roofline
from ampkit.tasks import Task, optional
from ampkit.tasks.check import check_first_batch
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.load import build_task, is_language_model
from ampkit.train import features
from ampkit.train.checkpointer import FileCheckpointer, ShardedCheckpointer, build_checkpointer
from ampkit.train.config import TrainConfig, check_train_fits
from ampkit.train.loggers import check_logger_available

if TYPE_CHECKING:
    from ampkit.distributed.context import ProcessGroupRun
    from ampkit.lora.apply import LoraInfo
    from ampkit.tasks import BatchStream


@dataclass
class RunObjects:
    """Everything a training run holds; built by `build_run`."""

    config: TrainConfig
    device: torch.device
    device_info: DeviceInfo
    warnings: list[str]
    task: Task
    """the workload: builds the model, streams the data, computes the loss (`ampkit.tasks`)"""
    model: nn.Module
    policy: Precision
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: BatchStream
    val_batches: list
    trainer: Trainer
    checkpointer: FileCheckpointer | ShardedCheckpointer
    """Single-file or sharded (DCP) checkpoints, chosen once with the parallel mode."""
    dedup: dict | None = None
    """What `--dedup` removed before the split (the language-model task; None elsewhere)."""
    features: features.FeatureReport | None = None
    """The throughput switches applied (checkpointed blocks, compile time, ...)."""
    parallel: LocalRun = dataclasses.field(default_factory=LocalRun)
    """This process's place in a data-parallel job (`LocalRun`: a one-process run)."""

    @property
    def lora(self) -> LoraInfo | None:
        """What `--lora` built (`ampkit.lora.apply.LoraInfo`), or None for a run that trains every weight."""
        return self.features.lora if self.features else None

    def features_summary(self) -> dict:
        """The summary's "throughput" section: switches, compile time, optimizer-state bytes, dedup, and
        the low-bit conversion (`Precision.conversion`), the modules kept in another precision (`--keep-fp32`)."""
        out = self.features.to_dict(self.optimizer) if self.features else {}
        out["dedup"] = self.dedup
        conversion = self.policy.conversion()
        if conversion is not None:  # the low-bit formats: the Linears converted, those kept in bf16 and why
            out["conversion"] = conversion.to_dict()
        if self.policy.overrides:  # module path -> regime, as the policy applied them
            out["module_precision"] = {"overrides": str(self.policy.overrides), "modules": dict(self.policy.overridden)}
        return out


def check_device(config: TrainConfig) -> tuple[torch.device, DeviceInfo, list[str]]:
    device = pick_device(config.device)
    info = describe_device(device)
    eps = train_warnings(config.precision, config.optimizer.optimizer)  # fp16 states: AdamW's eps rounds to 0
    return device, info, check_supported(config.precision, info) + eps


def new_model(task: Task, *, device: torch.device, seed: int, policy: Precision, sharded: bool = False) -> nn.Module:
    """The task's model, constructed inside `policy.init_context()` (weights in their storage dtype:
    bf16 for bf16-true): on the meta device where the task allows (no memory; `materialize` allocates
    and initialises it later; `sharded` (FSDP2): also a model whose weights are read per shard), else
    for real on `device` (the task's seeded init or its weights)."""
    meta = optional.meta_init(task) or (sharded and optional.meta_load(task))
    with policy.init_context():
        return task.build_model(device=torch.device("meta") if meta else device, seed=seed)


def build_run_model(
    task: Task,
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
    1. `new_model` inside `policy.init_context()`: on the meta device where the task allows (the
       built-in presets, an `hf:` config; under FSDP2 an `hf:` folder of safetensors weights too, read
       per shard in step 5), weights in their storage dtype; otherwise for real (a user's model, other
       weights: materialised on every rank, then sharded).
    2. `policy.convert_module`: a no-op for *-true (already in dtype); the low-bit formats swap Linear layers
       (on meta too; `policy.conversion()` reports which).
    3. activation checkpointing, then `torch.compile` (lazy: nothing is traced yet).
    4. FSDP2: `fully_shard` each of the task's repeated blocks, then the root (on meta: metadata only).
    5. `materialize`: `to_empty(device)` + `init_weights(seed)`; under FSDP2 each rank writes its slice of
       the same full init, one parameter at a time (so 2 ranks start where one process does), or reads
       its slice of the checkpoint (`ampkit.models.hf_load`).
    6. the compile warm-up, timed (needs real weights; under FSDP2 it runs the sharded model).
    7. DDP (needs real weights: it checks them across ranks).
    The optimizer comes next, over the final parameters.

    A LoRA run (`--lora`) replaces steps 1-2 and 5 with `ampkit.lora.build_lora_model`: the base born on
    the meta device in its storage dtype, materialised, then adapted (peft wraps real modules; adapters
    fp32, seeded); checkpointing and compile then see the adapted model. It runs in one process (no
    FSDP2 or DDP: `check_lora_run`), so nothing is sharded before the adapters exist.
    """
    lora, fsdp = None, parallel.mode == "fsdp"
    if config.lora.enabled:
        model, lora = build_lora_model(task, config.lora, precision=config.precision, device=device, seed=config.seed)
    else:
        model = policy.convert_module(new_model(task, device=device, seed=config.seed, policy=policy, sharded=fsdp))
    blocks = optional.repeated_blocks(task, model)
    model, report = apply_model_features(model, config, blocks=blocks)
    report.lora = lora

    def wrap(model: nn.Module) -> nn.Module:
        return wrap_model(
            model, run=parallel, spec=policy.spec, reduce_dtype=config.parallel.reduce_dtype, blocks=blocks
        )

    if fsdp:
        model = wrap(model)
    model = materialize(model, device=device, seed=config.seed)
    if config.features.compile:
        example = optional.example_batch(task, batch_size=config.data.batch_size, seed=config.seed)
        report.compile_s = features.warm_up_compiled(model, task=task, policy=policy, batch=example, device=device)
    if not fsdp:
        model = wrap(model)
    return model, report


def apply_model_features(
    model: nn.Module, config: TrainConfig, *, blocks: list[nn.Module]
) -> tuple[nn.Module, features.FeatureReport]:
    """Checkpointing (of the task's repeated `blocks`), then compile (lazy; `build_run_model` times its
    warm-up once the weights are real), on a model the policy already converted (meta or real)."""
    switches = config.features
    features.check_batching_supported(model, switches.batching)
    chosen = features.apply_activation_checkpointing(model, spec=switches.activation_checkpointing, blocks=blocks)
    if switches.compile:
        features.compile_model(model, dynamic=None if switches.batching == "pack" else True)
    return model, features.FeatureReport(
        features=switches, optimizer=config.optimizer.optimizer, checkpointed_blocks=chosen, compile_s=None
    )


def fp8_options(config: TrainConfig, info: DeviceInfo, task: Task, parallel: LocalRun) -> Fp8Options:
    """The fp8 recipe, and the roofline filter on a GPU the table knows (each Linear fed batch x
    sequence rows for a language model, batch rows otherwise); FSDP2 all-gathers fp8 weights."""
    gpu = GPUS.get(info.gpu_model) if info.gpu_model else None
    roofline = Roofline.from_gpu(gpu) if gpu is not None and info.has_fp8 else None
    tokens = config.data.batch_size * (config.data.seq_len if isinstance(task, LanguageModelTask) else 1)
    return Fp8Options(
        recipe=config.fp8_recipe, tokens=tokens, roofline=roofline, fsdp_all_gather=parallel.mode == "fsdp"
    )


def check_run_settings(config: TrainConfig, *, device: torch.device) -> None:
    """What can be refused before any data or model work (UsageError with the fix)."""
    if config.features.compile:
        features.check_compile_available(device)
    check_optimizer_available(config.optimizer.optimizer)  # a missing library names its extra
    check_lora_available(config.lora, device=device, precision=config.precision)  # peft; nf4 on this device


def build_run_data(config: TrainConfig, *, task: Task, parallel: LocalRun) -> tuple[BatchStream, list[Any]]:
    """The task's seeded training stream (dealt to the ranks of a data-parallel job) and held-out batches."""
    batch_size = config.data.batch_size
    sampler = task.train_stream(batch_size=batch_size, seed=config.seed)
    val_batches = task.held_out(batch_size=batch_size, max_batches=config.eval.eval_batches, seed=config.seed)
    if not val_batches:
        raise UsageError(
            f"task {task.name}: held_out() gave no batch; ampkit train evaluates on a held-out split: give the "
            "task held-out data"
        )
    if parallel.distributed:  # rank r takes batches r, r+W, ... of the one seeded stream (global batch: W x)
        sharded = RankShardedSampler(sampler, rank=parallel.rank, world_size=parallel.world_size, count=task.count)
        cast("ProcessGroupRun", parallel).sampler = sharded  # a distributed run's is a ProcessGroupRun
        return sharded, val_batches
    return sampler, val_batches


def build_run(config: TrainConfig, *, task: Task | None = None) -> RunObjects:
    """Every object of a training run, in data-flow order. `task`: a task object (the Python API), else `config`'s."""
    check_logger_available(config.log)  # a missing extra, an MLflow server that does not answer: before all else
    if task is None and is_language_model(config.model.task):  # the planner's ledger plans language models
        check_train_fits(config, device=pick_device(config.device))  # before anything is built
    device, info, warnings = check_device(config)
    # Joins the torchrun job before any data or model work; a rank's device is cuda:LOCAL_RANK.
    section = config.parallel
    parallel, device = init_run(
        parallel=section.parallel, device=device, reduce_dtype=section.reduce_dtype, timeout_s=section.dist_timeout_s
    )
    task = task if task is not None else build_task(config.task_spec())
    check_run_settings(config, device=device)
    sampler, val_batches = build_run_data(config, task=task, parallel=parallel)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    fp8, overrides = fp8_options(config, info, task, parallel), config.overrides  # overrides: applied by convert_module
    policy = build_precision(
        config.precision, device_type=device.type, scaler=config.scaler, fp8=fp8, overrides=overrides
    )
    model, feature_report = build_run_model(task, config, policy=policy, device=device, parallel=parallel)
    if not isinstance(task, LanguageModelTask):  # a user's task: its first batch must make sense before training
        check_first_batch(task, model, val_batches[0], device=device, policy=policy)
        reshard(model)  # FSDP2: back to sharded parameters before the optimizer takes them
    opt = config.optimizer
    trainer = build_trainer(
        model,
        policy,
        sampler,
        device=device,
        optimizer=opt.optimizer,
        lr=opt.lr,
        weight_decay=opt.weight_decay,
        warmup_steps=opt.warmup_steps,
        total_steps=config.steps,
        min_lr_ratio=opt.min_lr_ratio,
        clip_grad_norm=opt.clip_grad_norm,
        grad_accum=config.grad_accum,
        parallel=parallel,
        loss_fn=task.loss,
        count_fn=task.count,
    )
    return RunObjects(
        config=config,
        device=device,
        device_info=info,
        warnings=warnings,
        task=task,
        model=model,
        policy=policy,
        optimizer=trainer.optimizer,
        scheduler=trainer.scheduler,
        sampler=sampler,
        val_batches=val_batches,
        trainer=trainer,
        dedup=optional.dedup_stats(task, batch_size=config.data.batch_size, seed=config.seed),
        features=feature_report,
        parallel=parallel,
        checkpointer=build_checkpointer(config, parallel, model=model if feature_report.lora else None),
    )
