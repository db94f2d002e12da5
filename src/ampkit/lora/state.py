"""A LoRA run's checkpoint state: the adapters alone, and the frozen base named by identity and checksum.

The base never changes during a LoRA run, and it is rebuilt exactly on resume (seeded init, or the
`hf:PATH` folder's weights, cast or quantised the same way), so a checkpoint holds only the adapters
(with their optimizer state and the run state, written by the one checkpointer). What the base is
goes into the checkpoint's manifest as identity: its description and a sha256 over every frozen
tensor (names, dtypes, shapes and bytes, bitsandbytes' quantisation statistics included). A resume
or an export whose rebuilt base hashes differently (the folder's weights changed, another seed) is
refused rather than silently training adapters on a different base.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.lora.apply import is_adapter

_CHUNK = 1 << 26  # bytes hashed per piece (a large tensor is copied to the host in 64 MiB pieces)


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state_dict restricted to its adapters (what a LoRA checkpoint holds)."""
    return {k: v for k, v in model.state_dict().items() if is_adapter(k)}


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load adapters into a model whose base is already in place; anything else in `state`, or an
    adapter missing from it, is a checkpoint of another model (UsageError with the fix)."""
    expected = set(adapter_state_dict(model))
    given = set(state)
    if given != expected:
        extra, missing = sorted(given - expected), sorted(expected - given)
        what = f"unexpected {extra[0]}" if extra else f"missing {missing[0]}"
        raise UsageError(
            f"checkpoint's adapters do not match this model ({what}); resume with the same --model and [lora] "
            "settings, or start a new run"
        )
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise UsageError(f"checkpoint holds {result.unexpected_keys[0]}, which this model lacks; start a new run")


def _tensor_bytes(tensor: torch.Tensor):
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return
    raw = flat.contiguous().view(torch.uint8)
    for start in range(0, raw.numel(), _CHUNK):
        yield raw[start : start + _CHUNK].cpu().numpy().tobytes()


def base_checksum(model: nn.Module) -> dict[str, Any]:
    """sha256 of the frozen base (every non-adapter tensor of the state_dict), and its size."""
    digest = hashlib.sha256()
    tensors = elements = 0
    for name, value in model.state_dict().items():
        if is_adapter(name) or not isinstance(value, torch.Tensor):
            continue
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}\n".encode())
        for piece in _tensor_bytes(value):
            digest.update(piece)
        tensors += 1
        elements += value.numel()
    return {"sha256": digest.hexdigest(), "tensors": tensors, "elements": elements}


def base_identity(model: nn.Module, *, model_spec: str, base_dtype: str) -> dict[str, Any]:
    """The manifest's "base" entry: what the base is, and its checksum."""
    return {"model": model_spec, "dtype": base_dtype, **base_checksum(model)}
