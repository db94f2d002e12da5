"""Fixes doctor advises, as code you can apply: keep one module in fp32 under autocast.

`keep_in_fp32(model, "blocks.1.mlp", device_type="cuda")` is the module-level form of
`torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)` (which decorates an autograd
Function's forward): while autocast is on, the module's floating inputs are cast to fp32 and its
forward runs with autocast disabled, so every op inside it computes in fp32; its backward follows
the forward's dtypes. Outside autocast it changes nothing. It is done with hooks, so the module
keeps its path, its class and its state_dict keys (checkpoints stay loadable).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ampkit.diagnostics.inject import resolve_module


def _to_fp32(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.is_floating_point() else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_fp32(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_fp32(v) for k, v in obj.items()}
    return obj


class _Fp32Region:
    """A forward pre-hook / forward hook pair that brackets one module's forward in an fp32 region.

    The hooks keep no reference to the module (it arrives as an argument), so `copy.deepcopy` of
    the model copies the region with it.
    """

    def __init__(self, device_type: str):
        self.device_type = device_type
        self._open: list[torch.autocast | None] = []  # one entry per active call (re-entrant)

    def enter(self, module: nn.Module, args, kwargs):
        if not torch.is_autocast_enabled(self.device_type):
            self._open.append(None)
            return None
        region = torch.autocast(self.device_type, enabled=False)
        region.__enter__()
        self._open.append(region)
        return _to_fp32(args), _to_fp32(kwargs)

    def exit(self, module: nn.Module, args, output) -> None:
        region = self._open.pop() if self._open else None
        if region is not None:
            region.__exit__(None, None, None)


def keep_in_fp32(model: nn.Module, path: str, *, device_type: str) -> nn.Module:
    """Run the module at `path` in fp32 under autocast (see the module docstring); returns the model."""
    module = resolve_module(model, path)
    region = _Fp32Region(device_type)
    module.register_forward_pre_hook(region.enter, with_kwargs=True, prepend=True)
    module.register_forward_hook(region.exit, always_call=True)  # closes the region even if forward raises
    return model
