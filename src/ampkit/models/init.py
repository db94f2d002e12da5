"""Initial weights that do not depend on how the model is built, and the meta-device materialisation.

Each parameter draws from its own CPU generator, seeded from (run seed, parameter name), in fp32,
one parameter at a time, and the draw is then copied into the parameter: into its dtype (bf16-true
weights are the fp32 draw rounded to bf16), onto its device, and, for an FSDP2 parameter (a
sharded DTensor), only this rank's slice. So a one-process fp32 build, a bf16-true build and an
FSDP2 build at any world size start from the same values, and a model can be built on the meta
device first and given its values only after sharding (`materialize`).

Cost: a full fp32 copy of the parameter being initialised, one at a time (the largest, e.g. a 128k x
2048 embedding, is 1 GiB); every rank draws the full parameter to keep its slice, so init time does
not shrink with the world size. Values are drawn on the CPU so they are the same on every device.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for parameter `name` under run seed `seed` (stable across processes,
    unlike Python's salted `hash`)."""
    digest = hashlib.sha256(f"ampkit-init/{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def draw_seed() -> int:
    """A run seed from torch's global RNG (for callers that pass no seed)."""
    return int(torch.randint(0, 2**62, ()).item())


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return hasattr(tensor, "device_mesh") and hasattr(tensor, "placements")


def _local_part(full: torch.Tensor, param: Any) -> torch.Tensor:
    """This rank's part of `full` (the whole parameter) under DTensor `param`'s placements: `torch.chunk`
    along each sharded dim, which is how FSDP2 and DTensor split (the last ranks may get fewer rows, or
    none). `param` is a DTensor (duck-typed: DTensor is imported only where torch.distributed is used)."""
    part = full
    for mesh_dim, placement in enumerate(param.placements):
        if placement.is_shard():
            dim = placement.dim
            chunks = torch.chunk(part, param.device_mesh.size(mesh_dim), dim=dim)
            index = param.device_mesh.get_local_rank(mesh_dim)
            part = chunks[index] if index < len(chunks) else part.narrow(dim, 0, 0)
        elif not placement.is_replicate():
            raise NotImplementedError(f"initialising a DTensor placed as {placement} (only Shard and Replicate)")
    return part


def _local(param: Any) -> torch.Tensor:
    """The tensor that holds this rank's values (a DTensor's local shard, else the parameter itself)."""
    return param.to_local() if _is_dtensor(param) else param


@torch.no_grad()
def init_normal_(param: torch.Tensor, *, std: float, seed: int, name: str) -> None:
    """N(0, std) drawn in fp32 from `parameter_seed(seed, name)`, copied into `param`'s dtype, device and
    (FSDP2) shard. The values depend on (seed, name, shape) only."""
    generator = torch.Generator(device="cpu").manual_seed(parameter_seed(seed, name))
    full = torch.empty(param.shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
    target = _local(param)
    part = _local_part(full, param) if _is_dtensor(param) else full
    if part.shape != target.shape:
        raise RuntimeError(f"{name}: this rank's slice {tuple(part.shape)} != its shard {tuple(target.shape)}")
    target.copy_(part)


@torch.no_grad()
def init_ones_(param: torch.Tensor) -> None:
    """All ones (norm gains): no draw, and no full-size temporary."""
    _local(param).fill_(1.0)


def _fake_mode_active() -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(isinstance(mode, FakeTensorMode) for mode in _get_current_dispatch_mode_stack())


def _fake_storage(model: nn.Module) -> None:
    """Every meta parameter and buffer replaced by an empty CPU tensor of its shape and dtype (fake,
    under the active FakeTensorMode), tied parameters kept tied. `to_empty` cannot: under a fake mode
    it swaps tensors, which fails for a parameter the mode has seen (its memo holds a weakref)."""
    fresh: dict[int, torch.Tensor] = {}
    for module in model.modules():
        stores: list[tuple[dict[str, Any], Any]] = [
            (module._parameters, _parameter_like),
            (module._buffers, _tensor_like),
        ]
        for store, make in stores:
            for name, tensor in list(store.items()):
                if tensor is not None and tensor.is_meta:
                    store[name] = fresh.setdefault(id(tensor), make(tensor))


def _tensor_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype)


def _parameter_like(tensor: torch.Tensor) -> torch.Tensor:
    return nn.Parameter(_tensor_like(tensor), requires_grad=tensor.requires_grad)


def materialize(model: nn.Module, *, device: str | torch.device, seed: int) -> nn.Module:
    """Give a model built on the meta device its storage on `device` (`to_empty`) and its initial values
    (`model.init_weights(seed=seed)`); returns the model. Parameters keep the dtype they were built in.

    Preconditions: either every parameter and buffer is on the meta device (the built-in model, possibly
    already converted, checkpointed, compiled and FSDP2-sharded: then each rank allocates only its shards),
    or none is (a model built for real, e.g. `hf:PATH`: returned unchanged). The model defines
    `init_weights(*, seed)`, which must set every parameter and buffer (`to_empty` leaves them garbage).
    Not for a DDP-wrapped model: DDP needs real weights when it is built. Inside a FakeTensorMode (the
    planner tracing a task's step) the tensors become fake CPU ones and `init_weights` is not called.
    """
    tensors = [*model.parameters(), *model.buffers()]
    on_meta = [t.is_meta for t in tensors]
    if not any(on_meta):
        return model
    if not all(on_meta):
        raise RuntimeError("materialize: the model is partly on the meta device; to_empty would wipe the real part")
    if _fake_mode_active():  # the planner's tracer builds the model on fake tensors: shapes, no values
        _fake_storage(model)
        return model
    model.to_empty(device=device)
    init_weights: Any = model.init_weights  # the precondition: the model defines it
    init_weights(seed=seed)
    return model
