"""`ampkit train`'s typed config. Every field is also a flag (`--grad-accum`) and a TOML key (`grad_accum`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ampkit.distributed.settings import check_parallel_settings
from ampkit.errors import UsageError
from ampkit.precision import ScalerConfig, canonical_name
from ampkit.train.features import check_feature_settings
from ampkit.train.guard import check_guard_settings
from ampkit.train.loggers import check_log_kind


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A training run: what to train, on what, for how long, and under which precision."""

    precision: str = field(
        default="fp32", metadata={"help": "fp32, tf32, fp16-mixed, bf16-mixed, bf16-true, fp16-true (or an alias)"}
    )
    model: str = field(
        default="tiny",
        metadata={
            "help": "model preset name, or hf:PATH (a local Hugging Face model folder: config.json, "
            "optional weights and tokenizer)"
        },
    )
    data: str = field(
        default="default",
        metadata={
            "help": "'default' (embedded corpus), a .txt/.md file, a folder, or a .jsonl file with a 'text' field"
        },
    )
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda"})
    steps: int = field(default=300, metadata={"help": "optimizer steps (total, including resumed ones)"})
    batch_size: int = field(default=8, metadata={"help": "sequences per micro-batch"})
    seq_len: int = field(default=256, metadata={"help": "tokens per sequence (at most)"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    lr: float = field(default=3e-3, metadata={"help": "peak learning rate"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final LR as a fraction of the peak (cosine)"})
    warmup_steps: int = field(default=20, metadata={"help": "linear warmup steps"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay on matrices (not norms)"})
    clip_grad_norm: float = field(default=1.0, metadata={"help": "clip the global grad norm after unscaling (0 = off)"})
    seed: int = field(default=0, metadata={"help": "seed for weights, data order and RNG"})
    eval_every: int = field(default=0, metadata={"help": "held-out evaluation every N steps (0 = only at the end)"})
    eval_batches: int = field(default=8, metadata={"help": "held-out batches per evaluation"})
    checkpoint_every: int = field(default=0, metadata={"help": "checkpoint every N steps (0 = only at the end)"})
    allow_no_checkpoint: bool = field(
        default=False, metadata={"help": "keep training when a periodic checkpoint write fails (default: stop cleanly)"}
    )
    keep_checkpoints: int = field(default=2, metadata={"help": "how many recent checkpoints to keep"})
    log_every: int = field(default=0, metadata={"help": "log metrics every N steps (0 = auto: 1 on CPU, 10 on CUDA)"})
    init_scale: float = field(
        default=65536.0, metadata={"help": "fp16 loss scaler: initial scale (4096 tames early overflow)"}
    )
    growth_interval: int = field(default=2000, metadata={"help": "fp16 loss scaler: clean steps between growths"})
    growth_factor: float = field(default=2.0, metadata={"help": "fp16 loss scaler: growth multiplier"})
    backoff_factor: float = field(default=0.5, metadata={"help": "fp16 loss scaler: backoff multiplier on overflow"})
    min_scale: float = field(
        default=1.0, metadata={"help": "fp16 loss scaler: floor below which the run stops (0 = none)"}
    )
    # Throughput switches (docs/throughput.md; applied by build_run via ampkit.train.features).
    batching: str = field(
        default="pad",
        metadata={"help": "pad, bucket (similar lengths together) or pack (full rows, documents isolated)"},
    )
    activation_checkpointing: str = field(
        default="none", metadata={"help": "recompute block activations in backward: none, full or every-N"}
    )
    optimizer: str = field(default="adamw", metadata={"help": "adamw, adamw-8bit (bitsandbytes) or sgd"})
    compile: bool = field(
        default=False, metadata={"help": "torch.compile the model (compile time reported apart from step time)"}
    )
    dedup: str = field(
        default="none", metadata={"help": "none or exact (drop duplicate paragraphs before the train/val split)"}
    )
    # Numerics safety and diagnostics (docs/doctor.md; ampkit.train.guard, ampkit.diagnostics).
    guard: bool = field(
        default=False,
        metadata={
            "help": "NaN guard: on a non-finite loss, K skipped steps or a scale collapse, roll back to the "
            "last checkpoint, skip the batch, cut the LR"
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
    inject: str = field(default="", metadata={"help": "fault injection for demos/tests: module_path:phase:kind[@step]"})
    # Loggers beside metrics.jsonl, which is always written (ampkit.train.loggers).
    log: str = field(
        default="none",
        metadata={
            "help": "also log the scalars to: none or tensorboard "
            "(RUN_DIR/tensorboard; pip install 'ampkit[tensorboard]')"
        },
    )
    # Data parallelism (docs/distributed.md; ampkit.distributed).
    parallel: str = field(
        default="none",
        metadata={
            "help": "none, ddp (replicated weights) or fsdp (FSDP2: weights, grads and optimizer states "
            "sharded); run under torchrun or with --nproc"
        },
    )
    reduce_dtype: str = field(
        default="fp32",
        metadata={
            "help": "dtype gradients are reduced in across ranks: fp32 (stable at scale) or bf16 (half the traffic)"
        },
    )
    nproc: int = field(
        default=0,
        metadata={"help": "start N processes on this node through torchrun's launcher (0 = this process only)"},
    )
    fit_check: bool = field(
        default=True,
        metadata={"help": "refuse, before building the model, a step the memory planner says cannot fit this device"},
    )

    def __post_init__(self):
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
        self.scaler_config()  # validates the scaler knobs now, not mid-run
        check_feature_settings(
            batching=self.batching,
            activation_checkpointing=self.activation_checkpointing,
            optimizer=self.optimizer,
            dedup=self.dedup,
        )
        check_guard_settings(self)
        check_parallel_settings(self)
        check_log_kind(self.log)

    def scaler_config(self) -> ScalerConfig:
        return ScalerConfig(
            init_scale=self.init_scale,
            growth_factor=self.growth_factor,
            backoff_factor=self.backoff_factor,
            growth_interval=self.growth_interval,
            min_scale=self.min_scale,
        )


# Settings that may change when resuming; everything else must match the checkpoint.
RESUMABLE_OVERRIDES = frozenset(
    {
        "allow_no_checkpoint",
        "nproc",
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
