"""One planned training configuration, and the ledger both engines return for it.

Units: bytes everywhere; reports show GiB (1024**3 bytes). GB (1000**3) appears only where the
seeds' figures are reproduced, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampkit.distributed.settings import PARALLEL_MODES
from ampkit.errors import UsageError
from ampkit.options import (
    CHECKPOINTING_MODES,
    batch_size_field,
    choices_text,
    grad_accum_field,
    parallel_field,
    seq_len_field,
)
from ampkit.plan.numerics import plan_precision_name
from ampkit.plan.optim import OPTIMIZERS, check_optimizer
from ampkit.precision import precision_names_help
from ampkit.records import Record

TENSOR_LINES = (
    "parameters",
    "gradients",
    "optimizer_states",
    "master_weights",
    "weight_copies",
    "activations",
    "temporaries",
)
"""The lines of a step's ledger, both engines' (the traced engine's tracker sorts storages into them)."""
GIB = 1024**3  # GiB is 1024**3 bytes, GB is 1000**3
CUDA_CONTEXT_BYTES = GIB // 2
"""CUDA context, cuBLAS/cuDNN workspaces and kernels a PyTorch process holds outside the caching
allocator (~0.3-0.8 GiB on Ampere/Hopper with lazy module loading; 0.5 GiB assumed)."""
FRAGMENTATION = 0.05
"""Caching-allocator slack (reserved minus allocated) as a fraction of the tensor peak; measured
runs show 2-10% (less with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."""

LINE_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "master_weights": "fp32 master weights",
    "weight_copies": "low-precision weight copies",
    "activations": "activations",
    "temporaries": "temporaries (logits, loss, backward buffers)",
    "framework_reserve": "framework reserve (CUDA context + fragmentation)",
}


@dataclass(frozen=True, kw_only=True)
class StepSetting(Record):
    """What one training step holds: precision, optimizer, checkpointing, micro-batch shape."""

    precision: str = field(metadata={"help": f"precision name ({precision_names_help()})"})
    optimizer: str = field(default="adamw", metadata={"help": choices_text(OPTIMIZERS)})
    checkpointing: str = field(
        default="none",
        metadata={"help": f"activation checkpointing: {choices_text(CHECKPOINTING_MODES)} (full: every block)"},
    )
    micro_batch: int = batch_size_field(1)
    seq_len: int = seq_len_field(2048)
    grad_accum: int = grad_accum_field(note="> 1 keeps gradients alive through the forward")
    world_size: int = field(default=1, metadata={"help": "data-parallel processes"})
    parallel: str = parallel_field()

    def __post_init__(self):
        object.__setattr__(self, "precision", plan_precision_name(self.precision))
        object.__setattr__(self, "optimizer", check_optimizer(self.optimizer))
        if self.checkpointing not in CHECKPOINTING_MODES:
            raise UsageError(
                f"unknown checkpointing {self.checkpointing!r}; choose from: {', '.join(CHECKPOINTING_MODES)}"
            )
        if self.parallel not in PARALLEL_MODES:
            raise UsageError(f"unknown parallel mode {self.parallel!r}; choose from: {', '.join(PARALLEL_MODES)}")
        for name in ("micro_batch", "seq_len", "grad_accum", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch."""
        return self.micro_batch * self.seq_len

    @property
    def shards(self) -> int:
        """How many ways parameters, gradients and optimizer states are split per process."""
        return self.world_size if self.parallel == "fsdp" else 1

    def label(self) -> str:
        ckpt = ", ckpt" if self.checkpointing == "full" else ""
        return f"{self.precision} / {self.optimizer}{ckpt} / mb {self.micro_batch} x {self.seq_len}"


def framework_reserve(
    tensor_peak_bytes: int, *, context_bytes: int = CUDA_CONTEXT_BYTES, fragmentation: float = FRAGMENTATION
) -> int:
    return int(context_bytes + fragmentation * tensor_peak_bytes)


@dataclass(frozen=True)
class Reserve:
    """What a process needs beyond its tensor peak, as both engines and every fit search apply it."""

    context_bytes: int = CUDA_CONTEXT_BYTES
    """bytes held outside the caching allocator (CUDA context, workspaces, kernels)"""
    fragmentation: float = FRAGMENTATION
    """allocator slack, a fraction of the tensor peak"""

    def over(self, tensor_peak_bytes: int) -> int:
        """The framework reserve (bytes) on top of a tensor peak of `tensor_peak_bytes`."""
        return framework_reserve(tensor_peak_bytes, context_bytes=self.context_bytes, fragmentation=self.fragmentation)

    def tensor_budget(self, capacity: int) -> float:
        """The tensor peak (bytes) allowed in `capacity` bytes once the reserve is taken out."""
        return (capacity - self.context_bytes) / (1 + self.fragmentation)


DEFAULT_RESERVE = Reserve()
NO_RESERVE = Reserve(context_bytes=0, fragmentation=0.0)
"""the tensor peak alone (the pre-build fit check adds its own reserve)"""


@dataclass(frozen=True, kw_only=True)
class Ledger:
    """A step's memory: each line as live at the step's peak, and each line's own largest value."""

    setting: StepSetting
    engine: str
    """"analytic" or "traced" """
    at_peak: dict[str, int]
    """bytes per line (TENSOR_LINES) live at the moment the step's tensor memory peaks; they sum to it"""
    largest: dict[str, int]
    """each line's own maximum over the step (e.g. all gradients, which are not all alive at the peak)"""
    peak_moment: str
    """where in the step the peak falls (e.g. "backward: block 7 mlp")"""
    reserve: int
    """framework reserve bytes (CUDA context + allocator fragmentation), added to the tensor peak"""

    @classmethod
    def of_peak(
        cls,
        setting: StepSetting,
        engine: str,
        *,
        lines: dict[str, int],
        largest: dict[str, int],
        moment: str,
        reserve: Reserve,
    ) -> Ledger:
        """The ledger of a step whose tensor memory peaked with `lines` live (bytes) at `moment`: each
        line's `largest`, and `reserve` over that peak."""
        at_peak = dict(lines)
        return cls(
            setting=setting,
            engine=engine,
            at_peak=at_peak,
            largest=dict(largest),
            peak_moment=moment,
            reserve=reserve.over(sum(at_peak.values())),
        )

    @property
    def tensor_peak(self) -> int:
        return sum(self.at_peak.values())

    @property
    def total(self) -> int:
        """Bytes the step needs on the device: tensor peak + framework reserve."""
        return self.tensor_peak + self.reserve

    def lines(self) -> dict[str, int]:
        """At-peak lines plus the reserve, in display order."""
        return {**{k: self.at_peak[k] for k in TENSOR_LINES}, "framework_reserve": self.reserve}

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "setting": self.setting.to_dict(),
            "peak_moment": self.peak_moment,
            "lines_at_peak_bytes": self.lines(),
            "largest_bytes": dict(self.largest),
            "tensor_peak_bytes": self.tensor_peak,
            "total_bytes": self.total,
            "total_gib": round(self.total / GIB, 3),
        }
