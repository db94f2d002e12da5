"""The throughput switches of `ampkit train` and `ampkit bench --sweep` (`ampkit.sections.Features`, the
`[features]` section, and the optimizer of `[optimizer]`), applied to a built model.

Order of application (`build_run_model` follows it; each step assumes the previous one is done):
    precision policy's `convert_module` -> activation checkpointing -> compile -> (sharding,
    materialisation) -> compile warm-up -> optimizer
Checkpointing wraps blocks before compile so dynamo traces the checkpointed forward; both work on a
meta-device model; the warm-up needs real weights; the optimizer is built last, over the final
parameters.

- Activation checkpointing (`none | full | every-N`), per transformer block, non-reentrant
  (`torch.utils.checkpoint.checkpoint(use_reentrant=False)`): a checkpointed block keeps only its
  input during the forward and recomputes its activations in the backward. We replace the block's
  `forward` on the instance rather than wrapping the module, so module names, `state_dict` keys and
  checkpoints stay the same with and without it. Hazard: hooks on modules *inside* a checkpointed
  block fire twice per step (forward, then recompute).
- `--compile`: `nn.Module.compile()` (in place, so `state_dict` keys keep no `_orig_mod.` prefix).
  Compilation is lazy; `warm_up_compiled` triggers it on an example batch so its time is reported
  separately from step time.
- `--optimizer`: one of `ampkit.options.OPTIMIZERS`, built by `ampkit.core.optim.build_optimizer`
  (adamw-8bit: bitsandbytes; adamw-sr: torchao's bf16 stochastic rounding; adamw-kahan: torch-optimi).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ampkit.config import replace_settings
from ampkit.core.optim import check_optimizer_available
from ampkit.core.step import policy_loss
from ampkit.errors import UsageError
from ampkit.hardware.backend import backend_for
from ampkit.sections import Features, parse_activation_checkpointing

if TYPE_CHECKING:
    from ampkit.lora.apply import LoraInfo
    from ampkit.precision import Precision
    from ampkit.tasks import Task
    from ampkit.train.config import TrainConfig

_CHECKPOINTED = "_ampkit_checkpointed"  # flag on a block whose forward is already wrapped


def check_batching_supported(model: nn.Module, batching: str) -> None:
    """pack needs a model that takes per-row positions and a (B, 1, T, T) attention mask."""
    if batching == "pack" and not getattr(model, "supports_attn_mask", False):
        raise UsageError(
            f"--batching pack needs a model that accepts a custom attention mask for document isolation, and "
            f"{type(model).__name__} does not (supports_attn_mask is not True); use --batching bucket instead"
        )


# ---------------------------------------------------------------- activation checkpointing


def apply_activation_checkpointing(model: nn.Module, *, spec: str, blocks: list[nn.Module] | None = None) -> list[int]:
    """Checkpoint the blocks `spec` selects, in place; returns their indices (empty for "none").

    `blocks`: the task's repeated blocks (`ampkit.tasks.optional.repeated_blocks`); by default the
    model's `blocks` ModuleList (ampkit's LlamaLM, HF decoders). Precondition: the precision policy
    has already converted the model. Applying it twice is a no-op.
    """
    every = parse_activation_checkpointing(spec)
    if every == 0:
        return []
    if blocks is None:
        found = getattr(model, "blocks", None)
        blocks = list(found) if isinstance(found, nn.ModuleList) else []
    if not blocks:
        raise UsageError(
            f"--activation-checkpointing recomputes repeated blocks, and {type(model).__name__} names none "
            "(a task names them with repeated_blocks); use --activation-checkpointing none"
        )
    chosen = [i for i in range(len(blocks)) if (i + 1) % every == 0]
    for i in chosen:
        block = blocks[i]
        if not getattr(block, _CHECKPOINTED, False):
            # Non-reentrant: works with inputs that do not require grad, with torch.compile, and
            # with keyword arguments; the RNG state is preserved for the recompute by default.
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
            setattr(block, _CHECKPOINTED, True)
    return chosen


# ---------------------------------------------------------------- compile


def check_compile_available(device: torch.device) -> None:
    """On CPU, inductor compiles C++: refuse early when no C++ compiler is on PATH."""
    if device.type != "cpu":
        return
    candidates = [os.environ.get("CXX", ""), "g++", "clang++", "c++"]
    if not any(c and shutil.which(c) for c in candidates):
        raise UsageError(
            "--compile on CPU needs a C++ compiler (g++ or clang++) on PATH; install one "
            "(e.g. apt-get install g++) or drop --compile"
        )


def compile_model(model: nn.Module, *, dynamic: bool | None) -> nn.Module:
    """`model.compile(dynamic=...)` in place; returns the same module.

    `dynamic=True` for pad/bucket, whose row width changes per batch (one graph for all widths
    instead of a recompile per new width); pack rows are always `seq_len` wide (`dynamic=None`).
    """
    model.compile(dynamic=dynamic)
    return model


def warm_up_compiled(model: nn.Module, *, task: Task, policy: Precision, batch: Any, device: torch.device) -> float:
    """Compile time in seconds: one forward + backward on `batch`, gradients then discarded.

    Includes one eager-size step's execution (milliseconds against tens of seconds of compiling).
    Changes no weights and reads no RNG (the model has no dropout); the loss is not scaled, so the
    loss scaler's state is untouched. A sync point on CUDA.
    """
    batch = batch.to(device)
    started = time.perf_counter()
    with policy.run_context():  # the run's TF32 flags: compiled code is guarded on them
        loss, _ = policy_loss(policy, task.loss, model, batch)
        loss.backward()
        backend_for(device).synchronize()  # sync point on an accelerator: compile time includes the device work
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return seconds


# ---------------------------------------------------------------- optimizer state


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes held by the optimizer's state tensors: {"total": ..., "<dtype>": ...}.

    Each storage is counted once (bitsandbytes shares its quantization maps across parameters).
    FSDP2's states are DTensors: what this rank holds is their local shard.
    States are created lazily at the first step: before it, the total is 0.
    """
    seen: set[tuple[str, int]] = set()
    out: dict[str, int] = {"total": 0}
    for state in optimizer.state.values():
        for value in state.values():
            if not torch.is_tensor(value):
                continue
            if hasattr(value, "to_local"):
                value = value.to_local()
            storage = value.untyped_storage()
            key = (str(value.device), storage.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            dtype = str(value.dtype).removeprefix("torch.")
            out[dtype] = out.get(dtype, 0) + storage.nbytes()
            out["total"] += storage.nbytes()
    return out


# ---------------------------------------------------------------- named combinations (bench --sweep)


@dataclass(frozen=True, kw_only=True)
class FeatureSet:
    """One named combination of throughput switches, applied on top of a `TrainConfig`."""

    name: str
    """Label in the sweep's table, e.g. "pack+compile"."""
    features: Features = field(default_factory=Features)
    optimizer: str = "adamw"
    """`[optimizer] optimizer`: the 8-bit optimizer's states are a throughput switch too."""

    def settings(self) -> dict[str, Any]:
        """The switches this combination sets, by their flat names (the sweep's rows and worker jobs)."""
        return switches_with_optimizer(self.features, self.optimizer)


def switches_with_optimizer(features: Features, optimizer: str) -> dict[str, Any]:
    """`[features]`'s switches with `[optimizer] optimizer` among them, in the order summaries have
    always listed them (the optimizer was a switch of `[features]` before it had a section)."""
    switches = dataclasses.asdict(features)
    first = {k: switches.pop(k) for k in ("batching", "activation_checkpointing")}
    return {**first, "optimizer": optimizer, **switches}


SWEEP: tuple[FeatureSet, ...] = (
    FeatureSet(name="baseline"),
    FeatureSet(name="bucket", features=Features(batching="bucket")),
    FeatureSet(name="pack", features=Features(batching="pack")),
    FeatureSet(name="pack+checkpointing", features=Features(batching="pack", activation_checkpointing="full")),
    FeatureSet(name="pack+adamw-8bit", features=Features(batching="pack"), optimizer="adamw-8bit"),
    FeatureSet(name="pack+compile", features=Features(batching="pack", compile=True)),
    FeatureSet(name="pack+dedup", features=Features(batching="pack", dedup="exact")),
)
"""`ampkit bench --sweep`'s combinations, baseline first: each adds one switch to pack (except
bucket), so each row's difference from "pack" is what that switch buys."""


def get_feature_sets(names: str = "") -> list[FeatureSet]:
    """Comma-separated names from SWEEP ("" = all of them, in SWEEP's order)."""
    if not names.strip():
        return list(SWEEP)
    by_name = {fs.name: fs for fs in SWEEP}
    chosen = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in by_name:
            raise UsageError(f"unknown feature set {name!r}; choose from: {', '.join(by_name)}")
        chosen.append(by_name[name])
    return chosen


def apply_feature_set(config: TrainConfig, feature_set: FeatureSet) -> TrainConfig:
    """A copy of `config` with the combination's switches set; validated again."""
    return replace_settings(config, feature_set.settings(), source="the feature set")


def feature_set_unavailable(feature_set: FeatureSet, *, device: torch.device) -> str | None:
    """Why this combination cannot run here (the fix included), or None when it can."""
    try:
        check_optimizer_available(feature_set.optimizer)
        if feature_set.features.compile:
            check_compile_available(device)
    except UsageError as err:
        return str(err)
    return None


# ---------------------------------------------------------------- report


@dataclass(kw_only=True)
class FeatureReport:
    """What `build_run` applied, for the run summary."""

    features: Features
    """The switches the run was configured with."""
    optimizer: str
    """`[optimizer] optimizer`: the summary reports it with the switches (its states' bytes beside it)."""
    checkpointed_blocks: list[int]
    """Indices of the blocks whose activations are recomputed in the backward."""
    compile_s: float | None
    """Seconds spent compiling (forward + backward warm-up), reported apart from step time."""
    lora: LoraInfo | None = None
    """`--lora`: what was adapted (`ampkit.lora.apply.LoraInfo`; the summary's "lora" section), else None."""

    def to_dict(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """JSON-ready: the switches (dedup apart: `RunObjects.features_summary` reports it with what it
        removed), checkpointed blocks, compile time; with `optimizer`, its state bytes as they are now
        (0 before the first step)."""
        switches = switches_with_optimizer(self.features, self.optimizer)
        out = {k: v for k, v in switches.items() if k != "dedup"}
        out |= {"checkpointed_blocks": self.checkpointed_blocks, "compile_s": self.compile_s}
        if optimizer is not None:
            out["optimizer_state_bytes"] = optimizer_state_bytes(optimizer)
        return out
