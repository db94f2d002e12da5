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

Cost: one fp32 copy of the tensor being drawn, on the CPU, one at a time (the largest is the token
embedding: 128k x 4096 is 2 GiB); every rank draws the full tensor to keep its slice.
Hazard: `to_empty` gives each module new tensors, so tied weights (a head sharing the embedding)
come apart; they are tied again (`tie_weights`) before anything is drawn.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

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
_INT_SENTINEL = -(2**31) + 7  # an integer buffer still holding this was not written


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


def _seeded(draw: Callable[..., Any], *, seed: int, names: TensorNames) -> Callable[..., torch.Tensor]:
    """`draw` (a torch.nn.init function) made on an fp32 CPU copy by a generator of its own, then copied in."""

    def seeded_draw(tensor: torch.Tensor, *args: Any, generator: torch.Generator | None = None, **kwargs: Any):
        name = names.of(tensor)
        full = torch.empty(tuple(tensor.shape), dtype=torch.float32)
        draw(full, *args, generator=torch.Generator().manual_seed(parameter_seed(seed, name)), **kwargs)
        with torch.no_grad():
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
        table[key] = _seeded(draw, seed=seed, names=names)
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


def init_hf_weights(model: nn.Module, *, seed: int) -> None:
    """Initial values for a transformers model after `to_empty` (module docstring). Precondition: every
    parameter and buffer is real (not meta); their values on entry are ignored."""
    hf: Any = model  # transformers' PreTrainedModel
    hf.tie_weights()  # to_empty untied them; tie before drawing so a tied pair is drawn once
    _fill_sentinels(model)
    _clear_flags(model)
    with seeded_draws(model, seed=seed):
        hf.initialize_weights()
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
        draw = _seeded(torch.nn.init.normal_, seed=seed, names=names)
        for name in left:
            draw(params[name], std=_std(model))
    buffers = [name for name, b in model.named_buffers() if _unwritten(b)]
    if buffers:
        raise RuntimeError(f"transformers' init left buffer(s) unset after to_empty: {', '.join(buffers[:4])}")
