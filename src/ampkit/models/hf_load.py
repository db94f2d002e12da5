"""A Hugging Face folder's safetensors weights read per shard: under FSDP2 each rank reads only its bytes.

The run builds the `hf:` model on the meta device on every rank, `fully_shard`s it, then materialises
it (`to_empty`, then `HFCausalLM.init_weights`): transformers' seeded init (`models/hf_init.py`) for
what the checkpoint lacks (non-persistent buffers such as RoPE's frequencies), and for every tensor the
checkpoint holds, this rank's shard read from the file: the byte range of its rows (FSDP2 shards dim
0, so a shard is one contiguous run of the row-major tensor; its place from the DTensor's placement),
read with plain file reads in blocks of at most `READ_BLOCK_BYTES`, each cast into the parameter's
dtype (what `from_pretrained(dtype=...)` does: the values are bit for bit the whole load's). A shard of
another layout is read with safetensors' `get_slice`.
Hazard: safetensors' `safe_open` maps the file, and every page of the mapping a rank touches counts
in its resident memory until the file is closed (a slice is a view of the mapping); plain reads leave
the file in the page cache, outside the process, so a rank's peak is its shards plus one block.

Used only where the folder's weights are safetensors (`model.safetensors`, or the shards an
`model.safetensors.index.json` names) whose tensor names and shapes are the model's own (what
`save_pretrained` writes; a tied head saved once). Anything else (`pytorch_model.bin`, a checkpoint
whose names transformers renames on load, a missing tensor) is loaded whole on every rank by
`from_pretrained`, as before, with a warning saying why (`plan_sharded` returns the reason).
"""

from __future__ import annotations

import json
import logging
import math
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


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors' dtype names (little-endian, as the format stores them); others are read by `get_slice`"""


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file, from its header."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    """the first byte of its data in the file"""


def read_header(file: Path) -> dict[str, Entry]:
    """The tensors of a safetensors file (an 8-byte little-endian header length, then the JSON header;
    data offsets count from the header's end). Only the header is read."""
    with open(file, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(length))
    header.pop("__metadata__", None)
    return {
        name: Entry(dtype=e["dtype"], shape=tuple(e["shape"]), begin=8 + length + e["data_offsets"][0])
        for name, e in header.items()
    }


def safetensors_files(folder: Path) -> dict[str, Path] | None:
    """tensor name -> the safetensors file holding it (the index's weight map, or the single file's
    tensors); None when the folder's weights are not safetensors."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / SAFETENSORS
    if single.is_file():
        return dict.fromkeys(read_header(single), single)
    return None


def _file_shapes(files: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from the files' headers (no tensor data read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(files.values())):
        shapes.update((name, entry.shape) for name, entry in read_header(file).items())
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
        part of the file, any other tensor whole. One file open at a time."""
        tensors = dict([*model.named_parameters(), *model.named_buffers()])
        by_file: dict[Path, list[str]] = {}
        for name in sorted(self.names):
            by_file.setdefault(self.files[name], []).append(name)
        with torch.no_grad():
            for file, names in by_file.items():
                entries = read_header(file)
                with open(file, "rb", buffering=0) as fh:
                    for name in names:
                        read_tensor(fh, file, name, entries[name], tensors[name])


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


def read_tensor(fh: Any, file: Path, name: str, entry: Entry, tensor: torch.Tensor) -> None:
    """This rank's part of file tensor `name` into `tensor`'s local storage, cast to its dtype: its rows'
    bytes read from `fh` (the file, unbuffered) in blocks of at most READ_BLOCK_BYTES when the shard
    splits dim 0 alone (FSDP2's); else safetensors' `get_slice`."""
    local, box = _local(tensor), shard_box(tensor)
    if any(length == 0 for _, length in box):
        return  # this rank's shard is empty (more ranks than rows)
    dtype = _DTYPES.get(entry.dtype)
    whole_rows = all(box[d] == (0, entry.shape[d]) for d in range(1, len(box)))
    if dtype is None or not whole_rows:
        _read_slice(file, name, box, local)
        return
    inner = entry.shape[1:]
    row_bytes = math.prod(inner) * dtype.itemsize
    first, count = box[0] if box else (0, 1)  # a 0-d tensor: one "row" of one element
    rows = max(1, READ_BLOCK_BYTES // max(1, row_bytes))
    for r in range(0, count, rows):
        n = min(rows, count - r)
        raw = torch.empty(n * row_bytes, dtype=torch.uint8)
        _read_exact(fh, entry.begin + (first + r) * row_bytes, raw, what=f"{file}: {name}")
        values = raw.view(dtype).view(n, *inner) if box else raw.view(dtype).view(())
        (local[r : r + n] if box else local).copy_(values)


def _read_exact(fh: Any, offset: int, out: torch.Tensor, *, what: str) -> None:
    """Fill `out` (uint8) with the file's bytes from `offset` (a read may return fewer bytes than asked)."""
    array: Any = out.numpy()  # a writable buffer over the tensor's bytes
    view, got = memoryview(array), 0
    fh.seek(offset)
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            raise RuntimeError(f"{what} ends before its header says (a truncated file?)")
        got += n


def _read_slice(file: Path, name: str, box: list[tuple[int, int]], local: torch.Tensor) -> None:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt", device="cpu") as f:
        if not box:
            local.copy_(f.get_tensor(name))
            return
        local.copy_(f.get_slice(name)[tuple(slice(start, start + length) for start, length in box)])


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
