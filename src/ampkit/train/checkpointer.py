"""One checkpointer per run, chosen once when the run is built (torchtitan's checkpointer is the model).

It collects `state_dict()` from each stateful part of the run (model, optimizer, LR schedule,
precision policy, data stream, RNG, progress counters) and owns everything a checkpoint involves:
the payload, the finiteness check (a checkpoint holding a non-finite weight or optimizer value is
never written, so the newest one on disk is always one a rollback or a resume can use), writing,
loading, restoring and keep-last-K. Two implementations, the same interface:
- `FileCheckpointer`: one file per checkpoint (`ampkit.train.checkpoint`: atomic, sha256 manifest).
- `ShardedCheckpointer`: a DCP directory per checkpoint, every rank writing its shards
  (`ampkit.distributed.checkpoint`); every rank calls it at the same step (collectives inside).
A LoRA run's checkpoint holds the adapters in place of the model (`ampkit.lora.state`): the frozen
base is rebuilt on resume, and its identity and checksum are in the manifest, checked on load.
Callers say `checkpointer.save(objs, run_dir, progress)`; none asks whether the run is distributed.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from ampkit.distributed import checkpoint as sharded
from ampkit.errors import UsageError
from ampkit.lora.state import adapter_state_dict, base_identity, load_adapter_state
from ampkit.tasks import optional
from ampkit.train import checkpoint as single
from ampkit.train.checkpoint import CheckpointWriteFailed  # noqa: F401 (raised by the writers; re-exported)

if TYPE_CHECKING:
    from ampkit.core.parallel import LocalRun
    from ampkit.lora import LoraSettings
    from ampkit.precision import Precision
    from ampkit.sections import CheckpointSection, DataSection, ModelSection
    from ampkit.tasks import BatchStream, Task


class CheckpointConfig(Protocol):
    """The TrainConfig fields a checkpoint's identity reads; a dataclass (the payload stores all of it).
    A protocol because `ampkit.train.config` imports the guard, which imports this module."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def precision(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def model(self) -> ModelSection: ...
    @property
    def data(self) -> DataSection: ...
    @property
    def lora(self) -> LoraSettings: ...
    @property
    def checkpoint(self) -> CheckpointSection: ...


class CheckpointedRun(Protocol):
    """The parts of a run a checkpoint holds: an `ampkit.train.build.RunObjects` (which imports this
    module, so it is named by what it has). Read-only here: a checkpointer fills them, never rebinds them."""

    @property
    def config(self) -> CheckpointConfig: ...
    @property
    def task(self) -> Task: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LambdaLR: ...
    @property
    def policy(self) -> Precision: ...
    @property
    def sampler(self) -> BatchStream: ...


@dataclasses.dataclass
class RunProgress:
    """Counters that survive a resume (they are checkpoint state)."""

    step: int = 0
    tokens: int = 0
    skipped: int = 0
    first_loss: float | None = None
    last_loss: float | None = None


def run_identity(config: CheckpointConfig) -> dict[str, Any]:
    """What a checkpoint must match to be resumed by this run (checked against its manifest). The
    task and its arguments join only when a task is named, so checkpoints of language-model runs
    written before tasks existed keep resuming."""
    model = config.model
    identity = {
        "model": model.model,
        "precision": config.precision,
        "seq_len": config.data.seq_len,
        "seed": config.seed,
    }
    if model.task:
        identity |= {"task": model.task, "task_args": dict(sorted(model.task_args.items()))}
    return identity


def lora_identity(config: CheckpointConfig, model: nn.Module) -> dict[str, Any]:
    """A LoRA run's settings and its frozen base (description and sha256), checked on every load."""
    return {
        "lora": config.lora.describe(config.precision),
        "base": base_identity(
            model,
            model_spec=config.model.task or config.model.model,
            base_dtype=config.lora.resolved_base_dtype(config.precision),
        ),
    }


def local_state_is_finite(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Whether every weight and floating optimizer-state tensor this process holds is finite.

    Sharded (DTensor) values are checked on their local shard. Uses the max-abs norm: it is inf or
    nan exactly when an element is, and cannot overflow the way a sum of squares of large finite
    values can. One sync point per device (checkpoint steps only)."""
    tensors = [p.detach() for p in model.parameters()]
    tensors += [
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
    ]
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        if t.numel() and t.is_floating_point():  # a 4-bit base (nf4) is packed bytes: nothing to check
            by_device.setdefault(t.device, []).append(t)
    for group in by_device.values():
        peaks = torch.stack([n.float() for n in torch._foreach_norm(group, math.inf)])
        if not bool(torch.isfinite(peaks).all()):  # sync point
            return False
    return True


def run_state(objs: CheckpointedRun, progress: RunProgress) -> dict[str, Any]:
    """Everything but weights and optimizer state (a sharded checkpoint keeps this per rank)."""
    return {
        "config": dataclasses.asdict(objs.config),
        "model_config": optional.describe(objs.task),
        "scheduler": objs.scheduler.state_dict(),
        "precision": objs.policy.state_dict(),
        "sampler": objs.sampler.state_dict(),
        "rng": single.capture_rng_state(),
        "progress": dataclasses.asdict(progress),
    }


class _Checkpointer:
    """What both kinds share: saving only finite state, restoring the non-weight parts."""

    def __init__(self, *, keep: int, identity: dict[str, Any]) -> None:
        self.keep, self.identity = keep, identity
        self.adapters_only = "base" in identity  # a LoRA run: the frozen base is named, not saved

    def save(self, objs: CheckpointedRun, run_dir: Path, progress: RunProgress) -> bool:
        """Write a checkpoint of the run at `progress.step`; False (nothing written) when the state
        holds a non-finite value. A failed write raises `CheckpointWriteFailed`."""
        if not self._finite(objs):
            return False
        self._write(objs, Path(run_dir), progress)  # a failed write: CheckpointWriteFailed, the previous stays
        return True

    def resume(self, objs: CheckpointedRun, run_dir: Path, *, at_or_before: int | None = None) -> RunProgress:
        """Load the newest complete checkpoint (at or before step `at_or_before`: `doctor --from RUN@STEP`)
        into every part of the run; returns its counters."""
        ckpt = self._load_latest(objs, Path(run_dir), at_or_before)
        self._restore_training_state(objs, ckpt)
        objs.sampler.load_state_dict(ckpt["sampler"])
        single.restore_rng_state(ckpt["rng"])
        return RunProgress(**ckpt["progress"])

    def rollback(self, objs: CheckpointedRun, run_dir: Path) -> tuple[int, RunProgress]:
        """The NaN guard's restore: weights, optimizer, schedule and loss scaler from the newest
        checkpoint, but not the data position or the RNG (the offending batches are skipped).
        Returns the checkpoint's step and counters."""
        ckpt = self._load_latest(objs, Path(run_dir))
        self._restore_training_state(objs, ckpt)
        objs.optimizer.zero_grad(set_to_none=True)
        return ckpt["step"], RunProgress(**ckpt["progress"])

    def _restore_training_state(self, objs: CheckpointedRun, ckpt: dict[str, Any]) -> None:
        objs.scheduler.load_state_dict(ckpt["scheduler"])
        objs.policy.load_state_dict(ckpt["precision"])

    def _finite(self, objs: CheckpointedRun) -> bool:
        raise NotImplementedError

    def _write(self, objs: CheckpointedRun, run_dir: Path, progress: RunProgress) -> None:
        raise NotImplementedError

    def _load_latest(self, objs: CheckpointedRun, run_dir: Path, at_or_before: int | None = None) -> dict[str, Any]:
        raise NotImplementedError


class FileCheckpointer(_Checkpointer):
    """One process: RUN_DIR/checkpoints/step-NNNNNNNN.pt with its manifest."""

    def has_checkpoint(self, run_dir: Path) -> bool:
        return bool(single.list_checkpoints(run_dir))

    def _finite(self, objs: CheckpointedRun) -> bool:
        return local_state_is_finite(objs.model, objs.optimizer)

    def _write(self, objs: CheckpointedRun, run_dir: Path, progress: RunProgress) -> None:
        payload = {
            "model": adapter_state_dict(objs.model) if self.adapters_only else objs.model.state_dict(),
            "optimizer": objs.optimizer.state_dict(),
            **run_state(objs, progress),
        }
        single.save_checkpoint(run_dir, progress.step, payload, keep=self.keep, identity=self.identity)

    def _load_latest(self, objs: CheckpointedRun, run_dir: Path, at_or_before: int | None = None) -> dict[str, Any]:
        return single.load_latest(run_dir, identity=self.identity, at_or_before=at_or_before)

    def _restore_training_state(self, objs: CheckpointedRun, ckpt: dict[str, Any]) -> None:
        try:
            if self.adapters_only:
                load_adapter_state(objs.model, ckpt["model"])
            else:
                objs.model.load_state_dict(ckpt["model"])
            objs.optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, KeyError, ValueError) as err:
            first = str(err).strip().splitlines()[0][:160]
            raise UsageError(
                f"checkpoint does not match this model/optimizer ({first}); resume with the same "
                "--model and --precision, or start a new run"
            ) from None
        super()._restore_training_state(objs, ckpt)


class ShardedCheckpointer(_Checkpointer):
    """Data-parallel runs: a DCP directory, model and optimizer sharded, the rest per rank."""

    def __init__(self, *, keep: int, identity: dict[str, Any], parallel: LocalRun) -> None:
        super().__init__(keep=keep, identity=identity)
        self.parallel = parallel

    def has_checkpoint(self, run_dir: Path) -> bool:
        return bool(sharded.list_sharded(run_dir))

    def _finite(self, objs: CheckpointedRun) -> bool:
        return self.parallel.all_true(local_state_is_finite(objs.model, objs.optimizer))  # agreed by every rank

    def _write(self, objs: CheckpointedRun, run_dir: Path, progress: RunProgress) -> None:
        sharded.save_sharded(
            self.parallel,
            model=objs.model,
            optimizer=objs.optimizer,
            rank_state=run_state(objs, progress),
            run_dir=run_dir,
            step=progress.step,
            keep=self.keep,
            identity=self.identity,
        )

    def _load_latest(self, objs: CheckpointedRun, run_dir: Path, at_or_before: int | None = None) -> dict[str, Any]:
        """Verifies, loads the model and optimizer shards in place (DCP), returns this rank's state."""
        path = sharded.latest_sharded(run_dir, at_or_before=at_or_before)
        return sharded.load_sharded(
            self.parallel, model=objs.model, optimizer=objs.optimizer, path=path, identity=self.identity
        )


class WholeShardedReader(ShardedCheckpointer):
    """A data-parallel run's sharded checkpoints read in one process (`doctor --from`: its replay runs the
    job's global batch as `grad_accum x world_size` micro-batches of the one stream the ranks were dealt).
    It resumes only (a replay writes no checkpoint); the data position is the ranks' shared stream's
    (rank 0's `inner`; every rank's is the same)."""

    def __init__(self, *, identity: dict[str, Any]) -> None:
        from ampkit.core.parallel import LocalRun

        super().__init__(keep=1, identity=identity, parallel=LocalRun())

    def _write(self, objs: CheckpointedRun, run_dir: Path, progress: RunProgress) -> None:
        raise TypeError("a one-process reader of a sharded run writes no checkpoint")

    def _load_latest(self, objs: CheckpointedRun, run_dir: Path, at_or_before: int | None = None) -> dict[str, Any]:
        path = sharded.latest_sharded(run_dir, at_or_before=at_or_before)
        state = sharded.read_sharded_whole(path, model=objs.model, optimizer=objs.optimizer, identity=self.identity)
        return state | {"sampler": state["sampler"]["inner"]}  # the one stream the ranks were dealt from


def build_checkpointer(
    config: CheckpointConfig, parallel: LocalRun, *, model: nn.Module | None = None
) -> FileCheckpointer | ShardedCheckpointer:
    """Single-file for a one-process run, sharded (DCP) for a data-parallel one: decided once. `model`:
    a LoRA run's adapted model, whose frozen base (identity and checksum) joins the identity."""
    identity, keep = run_identity(config), config.checkpoint.keep_checkpoints
    if model is not None:
        identity |= lora_identity(config, model)
    if parallel.distributed:
        return ShardedCheckpointer(keep=keep, identity=identity, parallel=parallel)
    return FileCheckpointer(keep=keep, identity=identity)
