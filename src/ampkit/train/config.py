"""`ampkit train`'s typed config. Every setting is also a flag (`--grad-accum`) and a TOML key (`grad_accum`);
the settings of a section (`scaler`, `features`) are flags of their own names and keys of a TOML table
(`[scaler] init_scale` <-> `--init-scale`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampkit.config import flat_settings, resolve_config
from ampkit.distributed.settings import check_parallel_settings
from ampkit.errors import UsageError
from ampkit.lora import LoraSettings, check_lora_run, lora_field
from ampkit.options import (
    batch_size_field,
    clip_grad_norm_field,
    data_field,
    device_field,
    fit_check_field,
    grad_accum_field,
    inject_field,
    lr_field,
    model_field,
    nnodes_field,
    nproc_per_node_field,
    parallel_field,
    seed_field,
    seq_len_field,
    task_args_field,
    task_field,
)
from ampkit.precision import ScalerConfig, canonical_name, precision_names_help
from ampkit.precision.fp8_roofline import RECIPES as FP8_RECIPES
from ampkit.tasks.load import TaskSpec
from ampkit.train.features import Features
from ampkit.train.guard import check_guard_settings
from ampkit.train.loggers import check_log_kind

if TYPE_CHECKING:
    import torch

    from ampkit.plan.fit_check import FitEstimate


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A training run: what to train, on what, for how long, and under which precision."""

    precision: str = field(default="fp32", metadata={"help": f"{precision_names_help()} (or an alias)"})
    task: str = task_field()
    task_args: dict = task_args_field()
    model: str = model_field("tiny")
    data: str = data_field()
    device: str = device_field()
    steps: int = field(default=300, metadata={"help": "optimizer steps (total, including resumed ones)"})
    batch_size: int = batch_size_field(8)
    seq_len: int = seq_len_field(256, note="at most")
    grad_accum: int = grad_accum_field()
    lr: float = lr_field(3e-3)
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final LR as a fraction of the peak (cosine)"})
    warmup_steps: int = field(default=20, metadata={"help": "linear warmup steps"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay on matrices (not norms)"})
    clip_grad_norm: float = clip_grad_norm_field()
    seed: int = seed_field()
    eval_every: int = field(default=0, metadata={"help": "held-out evaluation every N steps (0 = only at the end)"})
    eval_batches: int = field(default=8, metadata={"help": "held-out batches per evaluation"})
    checkpoint_every: int = field(default=0, metadata={"help": "checkpoint every N steps (0 = only at the end)"})
    allow_no_checkpoint: bool = field(
        default=False, metadata={"help": "keep training when a periodic checkpoint write fails (default: stop cleanly)"}
    )
    keep_checkpoints: int = field(default=2, metadata={"help": "how many recent checkpoints to keep"})
    log_every: int = field(default=0, metadata={"help": "log metrics every N steps (0 = auto: 1 on CPU, 10 on CUDA)"})
    scaler: ScalerConfig = field(default_factory=ScalerConfig, metadata={"help": "the fp16-mixed loss scaler"})
    features: Features = field(
        default_factory=Features, metadata={"help": "throughput switches, docs/throughput.md"}
    )  # applied by build_run via ampkit.train.features
    lora: LoraSettings = lora_field()  # [lora]: --lora RANK ... --base-dtype (ampkit.lora, docs/lora.md)
    # Numerics safety and diagnostics (docs/doctor.md; ampkit.train.guard, ampkit.diagnostics).
    guard: bool = field(
        default=False,
        metadata={
            "help": "NaN guard: on a non-finite loss, K skipped steps or a scale collapse, roll back to the last "
            "checkpoint, skip the batch, cut the LR"
        },
    )
    guard_max_skips: int = field(
        default=10, metadata={"help": "guard: consecutive loss-scaler skips that trigger a rollback"}
    )
    guard_lr_factor: float = field(default=0.5, metadata={"help": "guard: LR multiplier applied at each rollback"})
    guard_max_rollbacks: int = field(
        default=3, metadata={"help": "guard: give up (run fails with a report) after this many rollbacks"}
    )
    detect_nonfinite: bool = field(
        default=False,
        metadata={"help": "locate the first module/phase producing inf/nan (slow: a sync per module call)"},
    )
    grad_stats_every: int = field(
        default=0, metadata={"help": "per-layer gradient statistics every N steps, logged to metrics.jsonl (0 = off)"}
    )
    inject: str = inject_field()
    fp8_recipe: str = field(
        default="tensorwise",
        metadata={"help": "fp8 only: torchao's recipe, tensorwise, rowwise or rowwise_with_gw_hp (dW in bf16)"},
    )
    # Loggers beside metrics.jsonl, which is always written (ampkit.train.loggers).
    log: str = field(
        default="none",
        metadata={
            "help": "also log the scalars to: none or tensorboard "
            "(RUN_DIR/tensorboard; pip install 'ampkit[tensorboard]')"
        },
    )
    # Data parallelism (docs/distributed.md; ampkit.distributed).
    parallel: str = parallel_field(note="run under torchrun or with --nproc-per-node")
    reduce_dtype: str = field(
        default="fp32",
        metadata={
            "help": "dtype gradients are reduced in across ranks: fp32 (stable at scale) or bf16 (half the traffic)"
        },
    )
    nproc_per_node: int = nproc_per_node_field(
        0, note="started here through torchrun's launcher; 0 = this process only", aliases=("nproc",)
    )
    nnodes: int = nnodes_field(note="more than 1: launch each node with torchrun itself, docs/distributed.md")
    fit_check: bool = fit_check_field()

    def task_spec(self) -> TaskSpec:
        """What building this run's task needs (`ampkit.tasks.load.build_task`)."""
        return TaskSpec(
            task=self.task,
            task_args=dict(self.task_args),
            model=self.model,
            data=self.data,
            seq_len=self.seq_len,
            batching=self.features.batching,
            dedup=self.features.dedup,
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", canonical_name(self.precision))
        positive = ("steps", "batch_size", "seq_len", "grad_accum", "eval_batches", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        non_negative = ("warmup_steps", "clip_grad_norm", "eval_every", "checkpoint_every", "log_every", "weight_decay")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise UsageError(f"--lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise UsageError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        check_guard_settings(self)
        check_parallel_settings(self)
        check_log_kind(self.log)
        if self.fp8_recipe not in FP8_RECIPES:
            raise UsageError(f"unknown --fp8-recipe {self.fp8_recipe!r}; choose one of: {', '.join(FP8_RECIPES)}")
        check_lora_run(self.lora, precision=self.precision, parallel=self.parallel)


def check_train_fits(config: TrainConfig, *, device: torch.device) -> FitEstimate | None:
    """Refuse (UsageError) a run whose step the planner says cannot fit `device` (a torch.device),
    before anything is built; returns the `ampkit.plan.fit_check.FitEstimate` (None: not checked).
    The step is the run's own: its optimizer and activation checkpointing (`[features]`), its
    accumulation, its data-parallel width and its LoRA settings."""
    if not config.fit_check:
        return None
    from ampkit.plan.fit_check import check_fit, vocab_size_for, world_size_for  # the planner: loaded to check

    return check_fit(
        model=config.model,
        precision=config.precision,
        batch_size=config.batch_size,
        seq_len=config.seq_len,
        device=device,
        optimizer=config.features.optimizer,
        grad_accum=config.grad_accum,
        checkpointing=config.features.activation_checkpointing,
        parallel=config.parallel,
        world_size=world_size_for(config.parallel, config.nproc_per_node * config.nnodes),
        vocab_size=vocab_size_for(config.model),
        command="train",
        lora=config.lora,
    )


# Settings that may change when resuming; everything else must match the checkpoint. A section's
# settings go by their own names (flags and `ampkit.config.given_flags` carry no section prefix).
RESUMABLE_OVERRIDES = frozenset(
    {
        "allow_no_checkpoint",
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
