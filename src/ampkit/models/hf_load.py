"""A Hugging Face folder's safetensors weights read per shard: under FSDP2 each rank reads only its bytes.

The run builds the `hf:` model on the meta device on every rank, `fully_shard`s it, then materialises
it (`to_empty`, then `HFCausalLM.init_weights`): transformers' seeded init (`models/hf_init.py`) for
what the checkpoint lacks (non-persistent buffers such as RoPE's frequencies), and for every tensor the
checkpoint holds, this rank's shard read from the file with safetensors' `get_slice`: the rows (and
columns) of its shard, in blocks of at most `READ_BLOCK_BYTES`, cast into the parameter's dtype (what
`from_pretrained(dtype=...)` does: the values are bit for bit the whole load's). safetensors maps the
file; the pages a rank touches are its shard's, so no rank reads, or holds, a full parameter.

Used only where the folder's weights are safetensors (`model.safetensors`, or the shards an
`model.safetensors.index.json` names) whose tensor names and shapes are the model's own (what
`save_pretrained` writes; a tied head saved once). Anything else (`pytorch_model.bin`, a checkpoint
whose names transformers renames on load, a missing tensor) is loaded whole on every rank by
`from_pretrained`, as before, with a warning saying why (`sharded_weights` returns the reason).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit.models.hf_init import shard_view
from ampkit.models.init import _is_dtensor, _local

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
READ_BLOCK_BYTES = 64 * 2**20
"""the most bytes of a tensor read from the file at a time (64 MiB), then cast and copied in"""


def safetensors_files(folder: Path) -> dict[str, Path] | None:
    """tensor name -> the safetensors file holding it (the index's weight map, or the single file's
    keys); None when the folder's weights are not safetensors."""
    from safetensors import safe_open

    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / SAFETENSORS
    if single.is_file():
        with safe_open(str(single), framework="pt", device="cpu") as f:
            return dict.fromkeys(f.keys(), single)
    return None


def _file_shapes(files: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from the files' headers (no tensor data read)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(files.values())):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names = f.keys()  # safe_open's handle is no mapping: it cannot be iterated
            shapes.update((name, tuple(f.get_slice(name).get_shape())) for name in names)
    return shapes


@dataclass(frozen=True)
class ShardedWeights:
    """The checkpoint tensors a model reads per shard (`ampkit.models.hf_init.WeightSource`)."""

    folder: Path
    files: dict[str, Path]
    """tensor name -> its safetensors file"""
    names: frozenset[str]
    """the model's parameters (distinct: a tied head once) and persistent buffers the files hold"""

    def read_into(self, model: nn.Module) -> None:
        """Write each named tensor of `model` (a transformers model): a DTensor's local shard from its
        slice of the file, any other tensor whole. One file open at a time."""
        from safetensors import safe_open

        tensors = dict([*model.named_parameters(), *model.named_buffers()])
        by_file: dict[Path, list[str]] = {}
        for name in sorted(self.names):
            by_file.setdefault(self.files[name], []).append(name)
        with torch.no_grad():
            for file, names in by_file.items():
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for name in names:
                        read_tensor(f, name, tensors[name])


def shard_box(tensor: Any) -> list[tuple[int, int]]:
    """(start, length) along each dim of this rank's shard of `tensor` in the full tensor (the whole
    tensor for a plain one): the shard view's offset decomposed by the full tensor's strides."""
    if not _is_dtensor(tensor):
        return [(0, size) for size in tensor.shape]
    part = shard_view(tensor)
    offset, box = part.storage_offset(), []
    for size, stride in zip(part.shape, part.stride()):
        start, offset = (offset // stride, offset % stride) if stride else (0, offset)
        box.append((start, size))
    return box


def read_tensor(f: Any, name: str, tensor: torch.Tensor) -> None:
    """This rank's part of file tensor `name` (safetensors' `safe_open` handle `f`) into `tensor`'s
    local storage, in row blocks of at most READ_BLOCK_BYTES, cast to its dtype."""
    local = _local(tensor)
    if tensor.dim() == 0:
        local.copy_(f.get_tensor(name))
        return
    box = shard_box(tensor)
    if any(length == 0 for _, length in box):
        return  # this rank's shard is empty (more ranks than rows)
    file_slice = f.get_slice(name)
    inner = [slice(start, start + length) for start, length in box[1:]]
    row_bytes = max(1, local[0].numel() * local.element_size())
    rows = max(1, READ_BLOCK_BYTES // row_bytes)
    (first, count) = box[0]
    for r in range(0, count, rows):
        n = min(rows, count - r)
        local[r : r + n].copy_(file_slice[(slice(first + r, first + r + n), *inner)])


def plan_sharded(folder: Path, model: nn.Module) -> ShardedWeights | str:
    """What a per-shard load of `folder` into `model` (a transformers model, on the meta device) reads,
    or why it cannot: every parameter must be in the files with its shape (buffers are read when the
    files hold them, else initialised)."""
    files = safetensors_files(folder)
    if files is None:
        return "its weights are not safetensors"
    shapes = _file_shapes(files)
    names: set[str] = set()
    for name, param in model.named_parameters():  # distinct: a tied head is its embedding's name
        if name not in shapes:
            return f"the weights files have no tensor {name!r} (a checkpoint transformers renames on load)"
        if shapes[name] != tuple(param.shape):
            return f"{name} is {list(shapes[name])} in the weights files but {list(param.shape)} in the model"
        names.add(name)
    for name, buffer in model.named_buffers():
        if name in shapes and shapes[name] == tuple(buffer.shape):
            names.add(name)
    return ShardedWeights(folder=folder, files=files, names=frozenset(names))


def warn_whole_load(spec: str, reason: str) -> None:
    logging.getLogger(__name__).warning(
        "--model %s: every rank loads the whole model before sharding (%s); save it with "
        "save_pretrained (safetensors) to load each rank's shards alone",
        spec,
        reason,
    )
