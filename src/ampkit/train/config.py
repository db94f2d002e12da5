"""`ampkit train`'s typed config. Every setting is also a flag (`--grad-accum`) and a TOML key (`grad_accum`);
the settings of a section (`model`, `optimizer`, `scaler`, `features` ...: `ampkit.sections`) are flags of
their own names and keys of a TOML table (`[scaler] init_scale` <-> `--init-scale`). Files and run
directories written when every setting was at top level (or `optimizer` in `[features]`) still load."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampkit.config import build_config, flat_settings, resolve_config
from ampkit.distributed.settings import check_inject_rank, check_single_process, known_world_size
from ampkit.errors import UsageError
from ampkit.lora import LoraSettings, check_lora_run, lora_field
from ampkit.options import (
    device_field,
    fit_check_field,
    grad_accum_field,
    keep_fp32_field,
    module_precision_field,
    seed_field,
)
from ampkit.precision import ModuleOverrides, ScalerConfig, canonical_name, precision_names_help
from ampkit.precision.fp8_roofline import RECIPES as FP8_RECIPES
from ampkit.sections import (
    CheckpointSection,
    DataSection,
    EvalSection,
    Features,
    GuardSection,
    LogSection,
    ModelSection,
    OptimizerSection,
    ParallelSection,
    section,
)
from ampkit.tasks.load import TaskSpec
from ampkit.train.guard import check_guard_settings

if TYPE_CHECKING:
    import torch

    from ampkit.plan.fit_check import FitEstimate


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A training run: the run itself at top level (precision, device, how long), then the sections it
    composes (`ampkit.sections`: what to train and on what, the optimizer, the throughput switches, data
    parallelism, the guard, evaluation, checkpoints, logs; `[scaler]` and `[lora]` from their packages)."""

    precision: str = field(default="fp32", metadata={"help": f"{precision_names_help()} (or an alias)"})
    keep_fp32: str = keep_fp32_field()
    module_precision: str = module_precision_field()
    device: str = device_field()
    steps: int = field(default=300, metadata={"help": "optimizer steps (total, including resumed ones)"})
    grad_accum: int = grad_accum_field()
    seed: int = seed_field()
    fp8_recipe: str = field(
        default="tensorwise",
        metadata={"help": "fp8 only: torchao's recipe, tensorwise, rowwise or rowwise_with_gw_hp (dW in bf16)"},
    )
    fit_check: bool = fit_check_field()
    model: ModelSection = section(ModelSection, "what to train: the task or the language model")
    data: DataSection = section(
        DataSection, "the language model's data and the batch shape", notes={"seq_len": "at most"}
    )
    optimizer: OptimizerSection = section(OptimizerSection, "the optimizer and its schedule")
    scaler: ScalerConfig = field(default_factory=ScalerConfig, metadata={"help": "the fp16-mixed loss scaler"})
    features: Features = section(Features, "throughput switches, docs/throughput.md")  # ampkit.train.features
    lora: LoraSettings = lora_field()  # [lora]: --lora RANK ... --base-dtype (ampkit.lora, docs/lora.md)
    parallel: ParallelSection = section(ParallelSection, "data parallelism, docs/distributed.md")
    guard: GuardSection = section(GuardSection, "numerics safety and diagnostics, docs/doctor.md")
    eval: EvalSection = section(EvalSection, "held-out evaluation")
    checkpoint: CheckpointSection = section(CheckpointSection, "checkpoints")
    log: LogSection = section(LogSection, "loggers beside metrics.jsonl")

    @classmethod
    def of(cls, **settings: Any) -> TrainConfig:
        """A config from settings by their flat names (`TrainConfig.of(steps=3, lr=1e-3)`; a section may be
        given whole): the Python API's and the tests' way (`ampkit.config.build_config`)."""
        return build_config(cls, settings)

    @property
    def overrides(self) -> ModuleOverrides:
        """The policy's per-module overrides: `--module-precision`, then `--keep-fp32` (each P=fp32)."""
        return ModuleOverrides.parse(self.module_precision) + ModuleOverrides.keep_fp32(self.keep_fp32)

    def task_spec(self) -> TaskSpec:
        """What building this run's task needs (`ampkit.tasks.load.build_task`)."""
        return TaskSpec(
            task=self.model.task,
            task_args=dict(self.model.task_args),
            **self.model.image_args(),
            model=self.model.model,
            data=self.data.data,
            seq_len=self.data.seq_len,
            batching=self.features.batching,
            dedup=self.features.dedup,
            train_on=self.data.train_on,
            chat_template=self.data.chat_template,
            text_field=self.data.text_field,
        )

    def doctor_args(self) -> str:
        """The `ampkit doctor` flags that diagnose this run's step (a diverged run's message names them)."""
        return (
            f"--model {self.model.model} --precision {self.precision} --batch-size {self.data.batch_size} "
            f"--seq-len {self.data.seq_len}"
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", canonical_name(self.precision))
        if self.overrides and self.lora.enabled:  # --module-precision's syntax is checked by `overrides` too
            raise UsageError(
                "--keep-fp32/--module-precision do not combine with --lora yet: the adapted model's module paths "
                "are peft's; keep the base in its --base-dtype"
            )
        positive = {"steps": self.steps, "grad_accum": self.grad_accum}
        positive |= {"batch_size": self.data.batch_size, "seq_len": self.data.seq_len}  # bench's 0 = auto: not here
        for name, value in positive.items():
            if value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        check_guard_settings(self.guard, checkpoint_every=self.checkpoint.checkpoint_every)
        parallel = self.parallel
        check_single_process(parallel.parallel, self.guard.single_process_parts(parallel.parallel))
        world = known_world_size(
            parallel=parallel.parallel, nproc_per_node=parallel.nproc_per_node, nnodes=parallel.nnodes
        )
        check_inject_rank(self.guard.inject_rank, inject=self.guard.inject, world_size=world)
        if self.fp8_recipe not in FP8_RECIPES:
            raise UsageError(f"unknown --fp8-recipe {self.fp8_recipe!r}; choose one of: {', '.join(FP8_RECIPES)}")
        check_lora_run(self.lora, precision=self.precision, parallel=self.parallel.parallel)


def check_train_fits(config: TrainConfig, *, device: torch.device) -> FitEstimate | None:
    """Refuse (UsageError) a run whose step the planner says cannot fit `device` (a torch.device),
    before anything is built; returns the `ampkit.plan.fit_check.FitEstimate` (None: not checked).
    The step is the run's own: its optimizer (`[optimizer]`) and activation checkpointing (`[features]`),
    its accumulation, its data-parallel width (`[parallel]`) and its LoRA settings."""
    if not config.fit_check:
        return None
    from ampkit.plan.fit_check import check_fit, vocab_size_for, world_size_for  # the planner: loaded to check

    parallel = config.parallel
    return check_fit(
        model=config.model.model,
        precision=config.precision,
        batch_size=config.data.batch_size,
        seq_len=config.data.seq_len,
        device=device,
        optimizer=config.optimizer.optimizer,
        grad_accum=config.grad_accum,
        checkpointing=config.features.activation_checkpointing,
        parallel=parallel.parallel,
        world_size=world_size_for(parallel.parallel, parallel.nproc_per_node * parallel.nnodes),
        vocab_size=vocab_size_for(config.model.model),
        command="train",
        lora=config.lora,
        overrides=config.overrides,  # --keep-fp32 / --module-precision: those weights in their regime's dtype
        images=config.model.image_args(),  # an hf: VLM: its images and frozen parts
    )


# Settings that may change when resuming; everything else must match the checkpoint. A section's
# settings go by their own names (flags and `ampkit.config.given_flags` carry no section prefix).
RESUMABLE_OVERRIDES = frozenset(
    {
        "allow_no_checkpoint",
        "dist_timeout_s",
        "nproc_per_node",
        "nnodes",
        "steps",
        "eval_every",
        "eval_batches",
        "checkpoint_every",
        "keep_checkpoints",
        "log_every",
        "device",
        "activation_checkpointing",
        "compile",
        "guard",
        "guard_max_skips",
        "guard_lr_factor",
        "guard_max_rollbacks",
        "detect_nonfinite",
        "grad_stats_every",
        "log",
        "mlflow_uri",
        "mlflow_experiment",
        "wandb_project",
        "wandb_mode",
        "fit_check",
    }
)  # speed, memory, logging only: same model


def resume_config(run_dir: str | Path, given: dict[str, Any]) -> TrainConfig:
    """The config of the run in `run_dir` (its saved config.json), with `given` settings (flat names,
    as the flags name them) applied where a resume may change them; any other change is refused."""
    saved = Path(run_dir) / "config.json"
    if not Path(run_dir).exists():
        raise UsageError(
            f"--resume {run_dir} does not exist; pass the directory of an earlier 'ampkit train' run "
            "(runs/<time>-train), or start a new run with --out"
        )
    if not saved.is_file():
        raise UsageError(f"{run_dir} is not an ampkit train run (no config.json); pass the run directory to --resume")
    base = json.loads(saved.read_text(encoding="utf-8"))
    was = flat_settings(TrainConfig, base)  # sections flattened, as the flags name them
    changed = {k: v for k, v in given.items() if k not in RESUMABLE_OVERRIDES and v != was.get(k)}
    if changed:
        names = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
        raise UsageError(
            f"{names} cannot change when resuming (the checkpoint was made with "
            f"{', '.join(f'{k}={was.get(k)!r}' for k in changed)}); start a new run instead"
        )
    return resolve_config(TrainConfig, argparse.Namespace(**given), base=base)  # flags over the saved config
