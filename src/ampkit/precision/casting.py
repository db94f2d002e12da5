"""A batch's floating tensors cast to a dtype (`cast_floating`), and the mark of fields only the loss reads.

Used by the -true policies' `convert_input` and by the per-module overrides' regions; it imports
nothing else of ampkit's, so both can (`precision/base.py` re-exports it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

LOSS_ONLY = "ampkit.loss_only"
"""Dataclass field metadata key: a batch field that only the loss reads, never the model (a regression
target), which `cast_floating` leaves in its dtype: `targets: Tensor = field(metadata={LOSS_ONLY: True})`."""


def cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """`data` with every floating-point tensor cast to `dtype`, inside tensors, dataclasses, tuples
    (named ones too), lists and dicts; integer and bool tensors (token ids, class labels, masks), fields
    marked `LOSS_ONLY` and any other object stay as they are. Nothing to cast: the same object back."""
    if isinstance(data, torch.Tensor):
        return data.to(dtype) if data.is_floating_point() else data
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        fields = [f for f in dataclasses.fields(data) if f.init and not f.metadata.get(LOSS_ONLY)]
        changes = {f.name: cast_floating(getattr(data, f.name), dtype) for f in fields}
        changed = {k: v for k, v in changes.items() if v is not getattr(data, k)}
        return dataclasses.replace(data, **changed) if changed else data
    if isinstance(data, (tuple, list)):
        items = [cast_floating(v, dtype) for v in data]
        if all(new is old for new, old in zip(items, data)):
            return data
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)  # a namedtuple takes fields
    if isinstance(data, dict):
        cast = {k: cast_floating(v, dtype) for k, v in data.items()}
        return data if all(cast[k] is v for k, v in data.items()) else cast
    return data
