"""A transformers model built on the meta device, given its initial weights later: seeded, per tensor.

transformers' own init (`PreTrainedModel.initialize_weights`: each model class's `_init_weights`,
dispatched per sub-model, rotary frequencies and position-id buffers included) runs on the model
after `to_empty`, with one change: every *random* draw it makes (`normal_`, `trunc_normal_`,
`xavier_uniform_`, ... through `transformers.initialization`) is made on the CPU, in fp32, by a
generator seeded from (run seed, the tensor's name) (`ampkit.models.init.parameter_seed`), then
copied into the tensor: into its dtype (bf16-true weights are the fp32 draw rounded), onto its
device, and for an FSDP2 parameter (a DTensor) only this rank's slice. So the initial weights depend
on the seed alone, as the built-in model's do, whatever the dtype, device or sharding; the
distributions are transformers' own (SigLIP's LeCun normal, Gemma's zero-centred norms, mllama's
zero gates, ...). Deterministic fills (`zeros_`, `ones_`, `copy_`) run on the tensors themselves.

Every tensor is filled with a sentinel first (NaN for floating point) and checked afterwards: a
parameter transformers' init leaves alone (a custom parameter of an unusual architecture) gets
N(0, initializer_range) seeded the same way, with a warning naming it; a buffer left alone is an
error (its value cannot be guessed; `to_empty` left it garbage).

Cost: in one process, one fp32 copy of the tensor being drawn, on the CPU, one at a time (the largest
is the token embedding: 128k x 4096 is 2 GiB). Under FSDP2 a rank never holds a full tensor for the
draws torch makes element by element in order (`normal_`, `uniform_`: every weight of the Llama-like
families): the draw is made in blocks of `DRAW_BLOCK` elements from the same generator, the rank
keeps the blocks' part inside its shard and drops the rest, stopping after its shard (the values are
bit for bit the whole draw's; `_blockwise_ok` checks that once per process, else the whole tensor is
drawn). Every rank still generates the numbers before its shard: init time does not shrink with the
world size. Other draws (`trunc_normal_`, `xavier_*`, ...) draw the full tensor on every rank.
A checkpoint's tensors (`WeightSource`: `ampkit.models.hf_load`) are read after the init, over it;
transformers' init skips them (marked initialised), so they cost no draw.
Hazard: `to_empty` gives each module new tensors, so tied weights (a head sharing the embedding)
come apart; they are tied again (`tie_weights`) before anything is drawn.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

from ampkit.models.init import _is_dtensor, _local, _local_part, parameter_seed

RANDOM_INITS = (
    "uniform_",
    "normal_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "trunc_normal_",
    "orthogonal_",
    "sparse_",
)
"""the entries of `transformers.initialization.TORCH_INIT_FUNCTIONS` that draw random numbers"""
BLOCKWISE = ("normal_", "uniform_")
"""draws torch's CPU kernels make one element at a time, in order, from the generator (normal_ in pairs
within groups of 16): drawn block by block (blocks a multiple of 16 elements, the last one >= 16),
they give the whole draw's values bit for bit"""
DRAW_BLOCK = 1 << 22
"""elements per block of a blockwise draw (16 MiB of fp32); a multiple of 16"""
_INT_SENTINEL = -(2**31) + 7  # an integer buffer still holding this was not written
_BLOCKWISE_CHECKED: dict[str, bool] = {}


class WeightSource(Protocol):
    """Tensors read from a checkpoint instead of initialised (`ampkit.models.hf_load.ShardedWeights`)."""

    @property
    def names(self) -> frozenset[str]:
        """the model's parameter and buffer names it writes (transformers' names)"""

    def read_into(self, model: nn.Module) -> None:
        """Write those tensors (for a DTensor, only this rank's shard)."""


class TensorNames:
    """Which model tensor a draw is for: by object (parameters and buffers), else by storage (a view,
    `.data`), else a name made from the order of unnamed draws (deterministic for a given model)."""

    def __init__(self, model: nn.Module):
        self.by_id: dict[int, str] = {}
        self.by_storage: dict[tuple[str, int], str] = {}
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            self.by_id.setdefault(id(tensor), name)
            local = _local(tensor)
            if local.device.type != "meta" and local.numel():
                self.by_storage.setdefault(_storage_key(local), name)
        self.unnamed = 0

    def of(self, tensor: torch.Tensor) -> str:
        name = self.by_id.get(id(tensor))
        if name is None and not _is_dtensor(tensor) and tensor.device.type != "meta" and tensor.numel():
            name = self.by_storage.get(_storage_key(tensor))
            if name is not None:
                name = f"{name}@{tensor.storage_offset()}:{tuple(tensor.shape)}"  # a view: its own draw
        if name is None:
            self.unnamed += 1
            name = f"<unnamed {self.unnamed}>:{tuple(tensor.shape)}"
        return name


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def shard_view(tensor: Any) -> torch.Tensor:
    """This rank's part of a DTensor as a view of a meta tensor of the full shape (`_local_part`'s
    split: FSDP2's): its `storage_offset`, strides and shape place the shard in the full tensor."""
    return _local_part(torch.empty(tuple(tensor.shape), device="meta"), tensor)


def flat_span(tensor: Any) -> tuple[int, int] | None:
    """[start, stop) of this rank's shard in the full tensor's flat (row-major) order, or None when the
    shard is not one contiguous run (sharded along a later dim) or its local tensor is not contiguous."""
    part = shard_view(tensor)
    if not part.is_contiguous() or not _local(tensor).is_contiguous():
        return None
    start = int(part.storage_offset())
    return start, start + int(part.numel())


def draw_span(
    out: torch.Tensor, span: tuple[int, int], numel: int, draw_block: Callable[[torch.Tensor], Any], *, block: int
) -> None:
    """Elements [start, stop) of a blockwise draw of `numel` elements into `out` (flat, stop - start
    elements): blocks of `block` elements (the last one takes the rest: >= 16 when numel is), each an
    fp32 CPU tensor `draw_block` fills from the one generator; stops after `stop`."""
    start, stop = span
    pos = 0
    while pos < stop:
        size = block if numel - pos >= block + 16 else numel - pos
        values = torch.empty(size, dtype=torch.float32)
        draw_block(values)
        lo, hi = max(start, pos), min(stop, pos + size)
        if lo < hi:
            out[lo - start : hi - start].copy_(values[lo - pos : hi - pos])
        pos += size


def _blockwise_ok(key: str, draw: Callable[..., Any]) -> bool:
    """Whether `draw` drawn in blocks gives its whole draw's values on this torch build (once per key)."""
    if key not in _BLOCKWISE_CHECKED:
        numel, block = 3 * 64 + 21, 64
        whole = torch.empty(numel)
        draw(whole, generator=torch.Generator().manual_seed(1))
        blocks = torch.empty(numel)
        generator = torch.Generator().manual_seed(1)
        draw_span(blocks, (0, numel), numel, lambda b: draw(b, generator=generator), block=block)
        _BLOCKWISE_CHECKED[key] = torch.equal(whole, blocks)
    return _BLOCKWISE_CHECKED[key]


def _seeded(draw: Callable[..., Any], *, seed: int, names: TensorNames, key: str = "") -> Callable[..., torch.Tensor]:
    """`draw` (a torch.nn.init function, `key` its table name) made in fp32 on the CPU by a generator of
    its own, then copied in: the whole tensor drawn, or a DTensor's shard drawn blockwise (module docstring)."""

    def seeded_draw(tensor: torch.Tensor, *args: Any, generator: torch.Generator | None = None, **kwargs: Any):
        own = torch.Generator().manual_seed(parameter_seed(seed, names.of(tensor)))
        with torch.no_grad():
            span = flat_span(tensor) if _is_dtensor(tensor) and key in BLOCKWISE else None
            if span is not None and _blockwise_ok(key, draw):
                local = _local(tensor).view(-1)
                draw_span(
                    local, span, tensor.numel(), lambda b: draw(b, *args, generator=own, **kwargs), block=DRAW_BLOCK
                )
                return tensor
            full = torch.empty(tuple(tensor.shape), dtype=torch.float32)
            draw(full, *args, generator=own, **kwargs)
            if _is_dtensor(tensor):
                _local(tensor).copy_(_local_part(full, tensor))
            else:
                tensor.copy_(full)
        return tensor

    return seeded_draw


@contextlib.contextmanager
def seeded_draws(model: nn.Module, *, seed: int) -> Iterator[None]:
    """Inside: transformers' random init functions draw seeded per tensor name (module docstring)."""
    from transformers import initialization

    table = initialization.TORCH_INIT_FUNCTIONS
    names = TensorNames(model)
    saved: dict[str, Any] = {key: table[key] for key in RANDOM_INITS if key in table}
    for key, draw in saved.items():
        table[key] = _seeded(draw, seed=seed, names=names, key=key)
    try:
        with torch.random.fork_rng(devices=[]):  # a draw that bypasses the table uses a seeded global RNG
            torch.manual_seed(parameter_seed(seed, "<global>"))
            yield
    finally:
        table.update(saved)


def _fill_sentinels(model: nn.Module) -> None:
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            local = _local(tensor)
            if local.is_floating_point() or local.is_complex():
                local.fill_(float("nan"))
            elif local.dtype != torch.bool:
                local.fill_(_INT_SENTINEL)


def _unwritten(tensor: torch.Tensor) -> bool:
    local = _local(tensor)
    if not local.numel() or local.dtype == torch.bool:
        return False
    if local.is_floating_point() or local.is_complex():
        return bool(torch.isnan(local).any())
    return bool((local == _INT_SENTINEL).all())


def _clear_flags(model: nn.Module) -> None:
    """transformers skips what it marked initialised (`_is_hf_initialized`); nothing is yet."""
    items: list[Any] = [*model.modules(), *model.parameters(), *model.buffers()]
    for item in items:
        if getattr(item, "_is_hf_initialized", False):
            item._is_hf_initialized = False


def _std(model: nn.Module) -> float:
    config: Any = getattr(model, "config", None)
    for source in (config, getattr(config, "get_text_config", lambda: None)()):
        value = getattr(source, "initializer_range", None)
        if isinstance(value, float) and value > 0:
            return value
    return 0.02


def init_hf_weights(model: nn.Module, *, seed: int, weights: WeightSource | None = None) -> None:
    """Initial values for a transformers model after `to_empty` (module docstring); `weights`: tensors
    read from a checkpoint (marked initialised, so transformers' init skips them, then read over
    whatever it wrote). Precondition: every parameter and buffer is real (not meta); their values on
    entry are ignored."""
    hf: Any = model  # transformers' PreTrainedModel
    hf.tie_weights()  # to_empty untied them; tie before drawing so a tied pair is drawn once
    _fill_sentinels(model)
    _clear_flags(model)
    if weights is not None:
        tensors = dict([*model.named_parameters(), *model.named_buffers()])
        for name in weights.names:
            tensors[name]._is_hf_initialized = True  # type: ignore[attr-defined]  # transformers' flag
    with seeded_draws(model, seed=seed):
        hf.initialize_weights()
    if weights is not None:
        weights.read_into(model)
    names = TensorNames(model)
    left = [name for name, p in model.named_parameters() if _unwritten(p)]
    if left:
        logging.getLogger(__name__).warning(
            "transformers' init left %d parameter(s) unset (%s); drawn N(0, %g)",
            len(left),
            ", ".join(left[:4]),
            _std(model),
        )
        params = dict(model.named_parameters())
        draw = _seeded(torch.nn.init.normal_, seed=seed, names=names, key="normal_")
        for name in left:
            draw(params[name], std=_std(model))
    buffers = [name for name, b in model.named_buffers() if _unwritten(b)]
    if buffers:
        raise RuntimeError(f"transformers' init left buffer(s) unset after to_empty: {', '.join(buffers[:4])}")
