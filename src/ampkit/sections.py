"""The run spec's sections, each defined once; a command's config composes the ones it uses.

torchtitan's per-component `Config`s are the model: a section is a keyword-only dataclass whose fields
are settings, flags of their own names and keys of a `[section]` table in TOML (`ampkit.config`: a
setting named like its section is its head, `[model] model = "tiny"` <-> `--model tiny`). Each section
checks in `__post_init__` what holds in every command that uses it; a command's config adds its own
rules (train's `--batch-size` >= 1 where bench's 0 means "auto") and the checks that span sections
(the guard's rollback needs `[checkpoint] checkpoint_every`). A command gives a section its own
defaults and its own words for a setting through the section's field (`section(...)`).

    section                         settings                                                  composed by
    ModelSection [model]            model, task, task_args (a [task] table: task + arguments) train, bench, doctor
                                    images_per_sample, image_size, freeze (hf: VLMs)
    DataSection [data]              data, seq_len, batch_size, train_on, chat_template,       train, bench
                                    text_field
    OptimizerSection [optimizer]    optimizer, lr, min_lr_ratio, warmup_steps, weight_decay,  train
                                    clip_grad_norm
    Features [features]             batching, activation_checkpointing, compile, dedup        train (bench --sweep)
    ParallelSection [parallel]      parallel, reduce_dtype, nproc_per_node (alias nproc),     train
                                    nnodes, dist_timeout_s
    GuardSection [guard]            guard, guard_max_skips, guard_lr_factor,                  train
                                    guard_max_rollbacks, detect_nonfinite, grad_stats_every,
                                    inject
    EvalSection [eval]              eval_every, eval_batches                                  train
    CheckpointSection [checkpoint]  checkpoint_every, keep_checkpoints, allow_no_checkpoint   train
    LogSection [log]                log (a comma list), log_every, mlflow_uri,                train
                                    mlflow_experiment, wandb_project, wandb_mode

The `[scaler]` (`ampkit.precision.ScalerConfig`) and `[lora]` (`ampkit.lora.LoraSettings`) sections live
with the code they configure. No torch here beyond what `ampkit.data`'s choice lists import.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ampkit.data import BATCHING_STRATEGIES, DEDUP_MODES
from ampkit.data.samples import check_train_on
from ampkit.distributed.settings import check_parallel_settings
from ampkit.errors import UsageError
from ampkit.options import (
    CHECKPOINTING_MODES,
    OPTIMIZERS,
    batch_size_field,
    clip_grad_norm_field,
    data_field,
    freeze_field,
    image_size_field,
    images_per_sample_field,
    inject_field,
    lr_field,
    model_field,
    nnodes_field,
    nproc_per_node_field,
    parallel_field,
    seq_len_field,
    task_args_field,
    task_field,
)

S = TypeVar("S")

LOG_KINDS = ("none", "tensorboard", "wandb", "mlflow")
"""`--log`'s choices (several: a comma list, "none" alone): what `ampkit.train.loggers` writes beside
metrics.jsonl."""
WANDB_MODES = ("auto", "offline", "online", "disabled")
"""`--wandb-mode`: auto is $WANDB_MODE where set (W&B's own variable), else offline (no network)."""
CHECKPOINTING_CHOICES = f"{', '.join(CHECKPOINTING_MODES)} or every-N (N >= 1: every N-th block)"
_EVERY_N = re.compile(r"^every-(\d+)$")


def section(cls: Callable[..., S], help_text: str, *, notes: dict[str, str] | None = None, **defaults: Any) -> S:
    """A command's field holding section `cls`: its `[table]`'s help, the command's defaults for its
    settings (`model="auto"`), and the command's note per setting (appended to the setting's help)."""
    return field(
        default_factory=lambda: cls(**defaults),
        metadata={"help": help_text, "notes": dict(notes or {})},
    )


def _at_least(least: float, **values: float) -> None:
    for name, value in values.items():
        if value < least:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {least}, got {value}")


# ---------------------------------------------------------------- what to train, on what


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    """What runs: the workload (`--task`, with a config file's `[task]` table) and the language model
    (an `hf:` image-text model's images and frozen parts too: docs/vlm.md)."""

    model: str = model_field("tiny")
    task: str = task_field()
    task_args: dict = task_args_field()
    images_per_sample: int = images_per_sample_field()
    image_size: str = image_size_field()
    freeze: str = freeze_field()

    def __post_init__(self) -> None:
        _at_least(0, images_per_sample=self.images_per_sample)

    def image_args(self) -> dict[str, Any]:
        """The image-text model's settings, as `ampkit.tasks.load.TaskSpec` names them."""
        return {"images_per_sample": self.images_per_sample, "image_size": self.image_size, "freeze": self.freeze}


@dataclass(frozen=True, kw_only=True)
class DataSection:
    """The language model's data and the batch shape: corpus, sequence length, micro-batch; for
    instruction data the tokens that carry a loss and the chat template (docs/data.md)."""

    data: str = data_field()
    seq_len: int = seq_len_field(256)
    batch_size: int = batch_size_field(8)
    train_on: str = field(
        default="auto",
        metadata={
            "help": "tokens with a loss: completion (answers only), all, or auto (completion for chat and "
            "prompt/completion data, all for text)"
        },
    )
    chat_template: str = field(
        default="",
        metadata={"help": "a .jinja chat template file (default: the hf: tokenizer's own, or the built-in one)"},
    )
    text_field: str = field(default="text", metadata={"help": "the field of a text .jsonl record that holds the text"})

    def __post_init__(self) -> None:
        _at_least(0, seq_len=self.seq_len, batch_size=self.batch_size)  # 0: a command's "auto" (bench)
        check_train_on(self.train_on)
        if not self.text_field:
            raise UsageError("--text-field must name a field, e.g. --text-field text")


@dataclass(frozen=True, kw_only=True)
class OptimizerSection:
    """The optimizer and its schedule (warmup + cosine, `ampkit.core.schedule`)."""

    optimizer: str = field(
        default="adamw", metadata={"help": f"{', '.join(OPTIMIZERS)} (adamw-sr and adamw-kahan: for bf16-true)"}
    )
    lr: float = lr_field(3e-3)
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final LR as a fraction of the peak (cosine)"})
    warmup_steps: int = field(default=20, metadata={"help": "linear warmup steps"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay on matrices (not norms)"})
    clip_grad_norm: float = clip_grad_norm_field()

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"unknown --optimizer {self.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
        if not self.lr > 0:
            raise UsageError(f"--lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise UsageError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        _at_least(0, warmup_steps=self.warmup_steps, weight_decay=self.weight_decay, clip_grad_norm=self.clip_grad_norm)


# ---------------------------------------------------------------- the throughput switches


def parse_activation_checkpointing(spec: str) -> int:
    """ "none" -> 0, "full" -> 1, "every-N" -> N: every N-th block (blocks N-1, 2N-1, ...) is checkpointed."""
    if spec == "none":
        return 0
    if spec == "full":
        return 1
    match = _EVERY_N.match(spec)
    if match and int(match.group(1)) >= 1:
        return int(match.group(1))
    raise UsageError(f"unknown --activation-checkpointing {spec!r}; use {CHECKPOINTING_CHOICES}")


@dataclass(frozen=True, kw_only=True)
class Features:
    """The throughput switches of a run (`ampkit.train.features` applies them): `TrainConfig.features`,
    the `[features]` table of a config file, flags of their own names (`--batching`, `--compile` ...).
    Unknown names are one-line UsageErrors at construction."""

    batching: str = field(
        default="pad",
        metadata={"help": "pad, bucket (similar lengths together) or pack (full rows, documents isolated)"},
    )
    activation_checkpointing: str = field(
        default="none", metadata={"help": "recompute block activations in backward: none, full or every-N"}
    )
    compile: bool = field(
        default=False, metadata={"help": "torch.compile the model (compile time reported apart from step time)"}
    )
    dedup: str = field(
        default="none", metadata={"help": "none or exact (drop duplicate paragraphs before the train/val split)"}
    )

    def __post_init__(self) -> None:
        if self.batching not in BATCHING_STRATEGIES:
            raise UsageError(f"unknown --batching {self.batching!r}; choose one of: {', '.join(BATCHING_STRATEGIES)}")
        parse_activation_checkpointing(self.activation_checkpointing)
        if self.dedup not in DEDUP_MODES:
            raise UsageError(f"unknown --dedup {self.dedup!r}; choose one of: {', '.join(DEDUP_MODES)}")


# ---------------------------------------------------------------- data parallelism


@dataclass(frozen=True, kw_only=True)
class ParallelSection:
    """Data parallelism (docs/distributed.md; `ampkit.distributed`): the mode and the processes."""

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
    dist_timeout_s: float = field(
        default=600.0,
        metadata={
            "help": "seconds a rank waits at a collective for its peers before the job ends naming the rank "
            "that did not come (the process group's timeout; raise it for long model loads)"
        },
    )

    def __post_init__(self) -> None:
        check_parallel_settings(
            parallel=self.parallel,
            reduce_dtype=self.reduce_dtype,
            nproc_per_node=self.nproc_per_node,
            nnodes=self.nnodes,
            dist_timeout_s=self.dist_timeout_s,
        )


# ---------------------------------------------------------------- numerics safety and diagnostics


@dataclass(frozen=True, kw_only=True)
class GuardSection:
    """Numerics safety and diagnostics (docs/doctor.md; `ampkit.train.guard`, `ampkit.diagnostics`): the
    NaN guard, the non-finite locator, gradient statistics, fault injection."""

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
    inject_rank: int = field(
        default=-1, metadata={"help": "the rank --inject's fault fires on under --parallel (-1 = every rank)"}
    )

    def __post_init__(self) -> None:
        if self.guard_max_skips < 1 or self.guard_max_rollbacks < 1:
            raise UsageError(
                f"--guard-max-skips and --guard-max-rollbacks must be >= 1, got {self.guard_max_skips}, "
                f"{self.guard_max_rollbacks}"
            )
        if not 0 < self.guard_lr_factor <= 1:
            raise UsageError(f"--guard-lr-factor must be in (0, 1], got {self.guard_lr_factor}")
        _at_least(0, grad_stats_every=self.grad_stats_every)
        _at_least(-1, inject_rank=self.inject_rank)

    @property
    def diagnostics(self) -> bool:
        """Whether any diagnostic hook is on (the locator, gradient statistics, an injected fault)."""
        return bool(self.detect_nonfinite or self.grad_stats_every or self.inject)

    def single_process_parts(self, parallel: str) -> list[str]:
        """What this section turns on that `parallel` cannot run: the guard, the locator and fault
        injection run under DDP and FSDP2 (`ampkit.train.guard`, `ampkit.diagnostics.train_hooks`);
        the gradient meters read whole gradients and weights, which only DDP's ranks hold."""
        parts = {"--grad-stats-every": bool(self.grad_stats_every) and parallel != "ddp"}
        return [what for what, on in parts.items() if on]


# ---------------------------------------------------------------- evaluation, checkpoints, logs


@dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Held-out evaluation."""

    eval_every: int = field(default=0, metadata={"help": "held-out evaluation every N steps (0 = only at the end)"})
    eval_batches: int = field(default=8, metadata={"help": "held-out batches per evaluation"})

    def __post_init__(self) -> None:
        _at_least(0, eval_every=self.eval_every)
        _at_least(1, eval_batches=self.eval_batches)


@dataclass(frozen=True, kw_only=True)
class CheckpointSection:
    """Checkpoints: how often, how many kept, what a failed write does."""

    checkpoint_every: int = field(default=0, metadata={"help": "checkpoint every N steps (0 = only at the end)"})
    keep_checkpoints: int = field(default=2, metadata={"help": "how many recent checkpoints to keep"})
    allow_no_checkpoint: bool = field(
        default=False, metadata={"help": "keep training when a periodic checkpoint write fails (default: stop cleanly)"}
    )

    def __post_init__(self) -> None:
        _at_least(0, checkpoint_every=self.checkpoint_every)
        _at_least(1, keep_checkpoints=self.keep_checkpoints)


def log_kinds(value: str) -> tuple[str, ...]:
    """`--log`'s loggers, in order: "tensorboard,mlflow" -> ("tensorboard", "mlflow"); "none" -> ().
    One-line UsageError for an unknown name, a repeated one, or "none" beside another."""
    kinds = tuple(part.strip() for part in value.split(","))
    unknown = [kind for kind in kinds if kind not in LOG_KINDS]
    if unknown:
        raise UsageError(f"unknown --log {unknown[0]!r}; choose one of: {', '.join(LOG_KINDS)} (several: a comma list)")
    if len(set(kinds)) != len(kinds):
        raise UsageError(f"--log {value!r} names a logger twice; name each once")
    if "none" in kinds and len(kinds) > 1:
        raise UsageError(f"--log {value!r}: none stands alone; drop it or the others")
    return () if kinds == ("none",) else kinds


@dataclass(frozen=True, kw_only=True)
class LogSection:
    """Loggers beside metrics.jsonl, which is always written (`ampkit.train.loggers`), and how often.
    Every logger gets the same metrics under the same names (`ampkit.train.log_names.METRIC_NAMES`)."""

    log: str = field(
        default="none",
        metadata={
            "help": "also log the metrics to: none, tensorboard (RUN_DIR/tensorboard), wandb, mlflow, or several "
            "as a comma list (tensorboard,mlflow); each is an extra: pip install 'ampkit[mlflow]' (docs/train.md)"
        },
    )
    log_every: int = field(default=0, metadata={"help": "log metrics every N steps (0 = auto: 1 on CPU, 10 on CUDA)"})
    mlflow_uri: str = field(
        default="auto",
        metadata={
            "help": "--log mlflow: the tracking URI (http(s)://HOST:PORT of an mlflow server, sqlite:///FILE.db, "
            "databricks); auto: $MLFLOW_TRACKING_URI where set, else sqlite:///RUN_DIR/../mlflow.db"
        },
    )
    mlflow_experiment: str = field(default="ampkit", metadata={"help": "--log mlflow: the experiment's name"})
    wandb_project: str = field(default="ampkit", metadata={"help": "--log wandb: the W&B project"})
    wandb_mode: str = field(
        default="auto",
        metadata={
            "help": "--log wandb: offline (no network; wandb sync later), online, disabled; auto: "
            "$WANDB_MODE where set, else offline"
        },
    )

    def __post_init__(self) -> None:
        log_kinds(self.log)
        _at_least(0, log_every=self.log_every)
        if self.wandb_mode not in WANDB_MODES:
            raise UsageError(f"unknown --wandb-mode {self.wandb_mode!r}; choose one of: {', '.join(WANDB_MODES)}")
        named = {"mlflow_uri": self.mlflow_uri, "mlflow_experiment": self.mlflow_experiment}
        for name, value in (named | {"wandb_project": self.wandb_project}).items():
            if not value.strip():
                raise UsageError(f"--{name.replace('_', '-')} is empty; give a value or leave the default")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The loggers `log` names, in order (none: empty)."""
        return log_kinds(self.log)
