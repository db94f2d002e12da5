"""The optional parts of the task contract, read with their defaults in one place, so train, bench,
doctor and plan never ask `hasattr` themselves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ampkit.tasks.base import Task


def meta_init(task: Task) -> bool:
    """Whether the task's model can be built on the meta device and initialised later by
    `ampkit.models.init.materialize` (its modules define `init_weights(seed=...)`)."""
    return bool(getattr(task, "meta_init", False))


def meta_load(task: Task) -> bool:
    """Whether the task's model, though loaded from weights, can be built on the meta device, sharded,
    then read per shard by its `init_weights` (`task.meta_load()`; an `hf:` folder of safetensors)."""
    method = getattr(task, "meta_load", None)
    return bool(method()) if method is not None else False


def repeated_blocks(task: Task, model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (activation checkpointing, FSDP2 units); [] when it names none."""
    method = getattr(task, "repeated_blocks", None)
    return list(method(model)) if method is not None else []


def flops_per_item(task: Task, *, batch_size: int) -> float | None:
    """The task's analytic training FLOPs per item, or None (then they are measured)."""
    method = getattr(task, "flops_per_item", None)
    return method(batch_size=batch_size) if method is not None else None


def fidelity_outputs(task: Task, outputs: Any, batch: Any) -> torch.Tensor:
    """What fidelity compares across precisions: a 2-D float tensor, one row per compared output."""
    method = getattr(task, "fidelity_outputs", None)
    if method is not None:
        return method(outputs, batch)
    tensor = outputs if isinstance(outputs, torch.Tensor) else _first_tensor(outputs)
    return tensor.detach().float().reshape(tensor.shape[0], -1)


def example_batch(task: Task, *, batch_size: int, seed: int) -> Any:
    """A batch shaped like training's, for the compile warm-up: the task's own example where it
    has one (the LM's full-width synthetic batch), else its first held-out batch (no stream moves)."""
    method = getattr(task, "example_batch", None)
    if method is not None:
        return method(batch_size=batch_size)
    return task.held_out(batch_size=batch_size, max_batches=1, seed=seed)[0]


def dedup_stats(task: Task, *, batch_size: int, seed: int) -> dict[str, Any] | None:
    """What the task's `--dedup` removed (the language model's), as the summary reports it."""
    method = getattr(task, "dedup_stats", None)
    return method(batch_size=batch_size, seed=seed) if method is not None else None


def accuracy(task: Task, outputs: Any, batch: Any) -> torch.Tensor | None:
    """0-d share of items predicted right (the smoke test's target is 1.0), or None: no accuracy."""
    method = getattr(task, "accuracy", None)
    return method(outputs, batch) if method is not None else None


def smoke_batch(task: Task, *, samples: int, seed: int) -> Any:
    """The batch the smoke test memorizes: the task's own choice, else the first `samples` items of
    a fresh training stream."""
    method = getattr(task, "smoke_batch", None)
    if method is not None:
        return method(samples=samples, seed=seed)
    return task.train_stream(batch_size=samples, seed=seed).next_batch()


def describe(task: Task) -> dict[str, Any]:
    method = getattr(task, "describe", None)
    info = dict(method()) if method is not None else {}
    return {"name": task.name, "unit": task.unit, **info}


def head(batch: Any, rows: int) -> Any:
    """The first `rows` rows of a batch (`batch.head(rows)` where the batch type offers it)."""
    method = getattr(batch, "head", None)
    return method(rows) if method is not None else batch


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`fn` applied to every tensor inside a batch: tensors, dataclasses, tuples, lists and dicts."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def tensors_of(obj: Any, _depth: int = 0) -> list[torch.Tensor]:
    """Every tensor inside a batch: tensors, dataclasses, tuples, lists, dicts and the attributes of
    any other object (a user's batch class), a few levels deep."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if _depth > 4:
        return []
    if isinstance(obj, dict):
        values = list(obj.values())
    elif isinstance(obj, (tuple, list)):
        values = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, nn.Module)):
        values = list(vars(obj).values())
    else:
        return []
    return [t for v in values for t in tensors_of(v, _depth + 1)]


def _first_tensor(obj: Any) -> torch.Tensor:
    found = tensors_of(obj)
    if not found:
        raise TypeError(f"the model's outputs ({type(obj).__name__}) hold no tensor")
    return found[0]
