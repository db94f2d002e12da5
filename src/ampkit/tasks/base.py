"""The task contract: what every workload gives ampkit, so train, bench, doctor and plan run any model.

A task builds the model, streams seeded, resumable batches (training and held out), computes the
loss of a batch and says how many items it covers, in a named unit. The training step, the bench
worker, doctor, the smoke test and fidelity call only this contract; none of them imports a model.

    task.unit                                   "tokens", "samples", ... (in every table and field)
    task.build_model(device=..., seed=...)      same seed -> same initial weights
    task.train_stream(batch_size=..., seed=...) .next_batch(), .state_dict(), .load_state_dict()
    task.held_out(batch_size=..., max_batches=..., seed=...)   a list of batches ([]: the task has none)
    task.loss(model, batch) -> (loss, outputs)  mean over the batch's items, fp32 0-d; model outputs
    task.count(batch) -> Counts                 host ints, no device sync: trained <= processed <= slots
                                                (`ampkit.core.counts`; an older (items, slots) pair still works)
Optional (a task may leave them out; `ampkit.tasks.optional` reads them with defaults):
    task.flops_per_item(batch_size=...) -> float | None   analytic training FLOPs per item
    task.repeated_blocks(model) -> list[nn.Module]        for activation checkpointing and FSDP2
    task.fidelity_outputs(outputs, batch) -> Tensor       the outputs fidelity compares (2-D float)
    task.smoke_batch(samples=..., seed=...) -> batch      a batch the smoke test must memorize
    task.example_batch(batch_size=...) -> batch           shaped like training's (compile warm-up)
    task.meta_init                                        True: build_model(device="meta") + init_weights
    task.meta_load() -> bool                              True: under FSDP2, the same for a model with weights
                                                          (init_weights reads each rank's shards)
    task.accuracy(outputs, batch) -> Tensor               0-d share of items predicted right
    task.describe() -> dict                               what the summary says about the task
Batches are any object with `.to(device)` that `loss` and `count` understand; `TensorBatch` (a
pair of tensors) serves supervised tasks. A `-true` precision casts a batch's floating-point tensors
to its dtype before the model sees them (`Precision.convert_input`: tensors, dataclasses, tuples,
lists, dicts); integer tensors and fields only the loss reads (`TensorBatch.targets`) stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ampkit.core.counts import Counts
from ampkit.errors import UsageError
from ampkit.precision.base import LOSS_ONLY


@runtime_checkable
class BatchStream(Protocol):
    """An infinite, seeded stream of batches whose position is checkpoint state."""

    def next_batch(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Task(Protocol):
    """The contract (see the module docstring); `name` and `unit` are plain attributes."""

    name: str
    unit: str

    def build_model(self, *, device: torch.device, seed: int) -> nn.Module: ...

    def train_stream(self, *, batch_size: int, seed: int) -> BatchStream: ...

    def held_out(self, *, batch_size: int, max_batches: int, seed: int) -> list[Any]: ...

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, Any]: ...

    def count(self, batch: Any) -> Counts | tuple[int, int]: ...


@dataclass(frozen=True)
class TensorBatch:
    """A supervised batch: `inputs` (B, ...) and `targets` (B, ...) tensors."""

    inputs: torch.Tensor
    targets: torch.Tensor = field(metadata={LOSS_ONLY: True})
    """read by the loss only: a -true precision leaves float targets in their dtype (the loss is fp32)"""

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> TensorBatch:
        return TensorBatch(
            self.inputs.to(device, non_blocking=non_blocking), self.targets.to(device, non_blocking=non_blocking)
        )

    @property
    def size(self) -> int:
        return int(self.inputs.shape[0])

    def head(self, rows: int) -> TensorBatch:
        """The first `rows` rows (fidelity compares a few)."""
        return TensorBatch(self.inputs[:rows], self.targets[:rows])


class IndexStream:
    """Seeded, resumable, infinite stream of `TensorBatch`es over in-memory tensors.

    Epoch e visits the rows in `torch.randperm(N, generator=Generator().manual_seed(seed + e))`
    order (its own generator: the global RNG is never read); a batch may straddle two epochs, so
    every batch has `batch_size` rows. The position is (epoch, cursor): `state_dict()` restores it."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, *, batch_size: int, seed: int):
        if len(inputs) != len(targets) or len(inputs) == 0:
            raise UsageError(f"a task's data needs as many targets as inputs (> 0), got {len(inputs)}, {len(targets)}")
        if batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
        self.inputs, self.targets = inputs, targets
        self.batch_size, self.seed = batch_size, seed
        self.epoch = self.cursor = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        return torch.randperm(len(self.inputs), generator=torch.Generator().manual_seed(self.seed + epoch))

    def next_batch(self) -> TensorBatch:
        picked: list[torch.Tensor] = []
        need = self.batch_size
        while need:
            take = self._order[self.cursor : self.cursor + need]
            picked.append(take)
            need -= len(take)
            self.cursor += len(take)
            if self.cursor == len(self._order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
        index = torch.cat(picked)
        return TensorBatch(self.inputs[index], self.targets[index])

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "rows": len(self.inputs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, mine in (("seed", self.seed), ("rows", len(self.inputs))):
            if state.get(key) != mine:
                raise UsageError(
                    f"cannot resume the data stream: saved {key}={state.get(key)!r} but this run has {mine!r}; "
                    "resume with the same task and seed"
                )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation(self.epoch)


def fixed_batches(inputs: torch.Tensor, targets: torch.Tensor, *, batch_size: int, max_batches: int) -> list:
    """Held-out batches in their stored order (no shuffling: the same batches every evaluation)."""
    out = []
    for start in range(0, min(len(inputs), batch_size * max_batches), batch_size):
        out.append(TensorBatch(inputs[start : start + batch_size], targets[start : start + batch_size]))
    return out


def classification_accuracy(outputs: torch.Tensor, batch: TensorBatch) -> torch.Tensor:
    """Share of rows whose argmax matches the class target (0-d, on device)."""
    return (outputs.argmax(-1) == batch.targets).float().mean()


def class_targets(targets: torch.Tensor) -> bool:
    """Whether `targets` can be class indices: an integer dtype (bool and float targets cannot)."""
    return not (targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool)


def _tensor_pair(task: str, part: str, pair: Any) -> None:
    ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, torch.Tensor) for t in pair)
    if not ok:
        raise UsageError(f"task {task}: {part} must be an (inputs, targets) pair of tensors, got {type(pair).__name__}")


@dataclass(kw_only=True)
class SupervisedTask:
    """A supervised workload from tensors: the common case, and what a user's task file builds.

    `model(seed)` returns a fresh model (ampkit seeds the global RNG before calling it too);
    `loss_fn(outputs, targets)` returns the mean loss over the batch (computed here in fp32);
    `train` and `held` are (inputs, targets) pairs of tensors; one item is one row ("samples").
    Whether it is a classification (an argmax accuracy for the smoke test) is declared, or inferred
    from the training targets: integer class indices are one, float targets (a regression) are not.
    """

    name: str
    model: Callable[[], nn.Module]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    train: tuple[torch.Tensor, torch.Tensor]
    held: tuple[torch.Tensor, torch.Tensor] | None = None
    unit: str = "samples"
    blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None
    """the model's repeated blocks (activation checkpointing, FSDP2 wrapping); None: none"""
    classification: bool | None = None
    """targets are class indices: the smoke test and doctor read an argmax accuracy over the outputs'
    last dim (False: the smoke test passes on the loss); None: inferred, True for integer targets"""
    info: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _tensor_pair(self.name, "train", self.train)
        if self.held is not None:
            _tensor_pair(self.name, "held", self.held)
        integer = class_targets(self.train[1])
        if self.classification is None:
            self.classification = integer
        elif self.classification and not integer:
            raise UsageError(
                f"task {self.name}: classification=True needs integer class targets, got {self.train[1].dtype}; "
                "pass classification=False for a regression (the smoke test then reads the loss)"
            )

    def build_model(self, *, device: torch.device, seed: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self.model()
        if not isinstance(model, nn.Module):
            raise UsageError(f"task {self.name}: its model factory returned {type(model).__name__}, not an nn.Module")
        # Built on the CPU (the same initial weights on every device), moved only when it must be:
        # `.to()` of an already-placed model would copy (or, on fake tensors, fail to swap) for nothing.
        return model if torch.device(device) == torch.device("cpu") else model.to(device)

    def train_stream(self, *, batch_size: int, seed: int) -> IndexStream:
        return IndexStream(*self.train, batch_size=batch_size, seed=seed)

    def held_out(self, *, batch_size: int, max_batches: int, seed: int = 0) -> list[TensorBatch]:
        """The held-out rows in their stored order (the split is fixed: `seed` does not move it)."""
        if self.held is None:
            return []
        return fixed_batches(*self.held, batch_size=batch_size, max_batches=max_batches)

    def loss(self, model: nn.Module, batch: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = model(batch.inputs)
        return self.loss_fn(outputs.float(), batch.targets), outputs

    def count(self, batch: TensorBatch) -> Counts:
        return Counts(trained=batch.size, processed=batch.size, slots=batch.size)

    def repeated_blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(self.blocks(model)) if self.blocks else []

    def fidelity_outputs(self, outputs: torch.Tensor, batch: TensorBatch) -> torch.Tensor:
        return outputs.detach().float().reshape(batch.size, -1)

    def smoke_batch(self, *, samples: int, seed: int) -> TensorBatch:
        """The first `samples` training rows of the seeded order."""
        return IndexStream(*self.train, batch_size=samples, seed=seed).next_batch()

    def accuracy(self, outputs: torch.Tensor, batch: TensorBatch) -> torch.Tensor | None:
        """The argmax accuracy of a classification, None for any other task."""
        if not self.classification:
            return None
        if tuple(outputs.shape[:-1]) != tuple(batch.targets.shape):
            raise UsageError(
                f"task {self.name}: a classification's accuracy takes the argmax over the outputs' last dim, but "
                f"its outputs {tuple(outputs.shape)} do not match its targets {tuple(batch.targets.shape)}; "
                "give (..., classes) outputs or pass classification=False"
            )
        return classification_accuracy(outputs, batch)

    def describe(self) -> dict[str, Any]:
        """Name, unit, data sizes (bench caps the batch it recommends at `train_samples`), then `info`."""
        sizes = {"train_samples": len(self.train[0]), "held_out_samples": len(self.held[0]) if self.held else 0}
        kind = {"classification": self.classification}
        return {"name": self.name, "unit": self.unit, **kind, **sizes, **(self.info or {})}
