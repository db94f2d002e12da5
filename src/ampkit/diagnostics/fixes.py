"""Fixes doctor advises, as code you can apply: keep one module in fp32 under autocast.

`keep_in_fp32(model, "blocks.1.mlp", device_type="cuda")` is the module-level form of
`torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)` (which decorates an autograd
Function's forward): the module's floating inputs are cast to fp32 and its forward runs with autocast
disabled, so every op inside it computes in fp32; its backward follows the forward's dtypes. It is the
precision policy's own per-module override (`ampkit.precision.ModuleOverrides`, what `--keep-fp32`
gives `build_precision`), applied to a model that runs under your own autocast: there is one
implementation. The module's forward is wrapped in place, so it keeps its path, its class and its
state_dict keys (checkpoints stay loadable). `path` is any pattern the override takes (a path, a glob, a VLM part).
"""

from __future__ import annotations

from torch import nn

from ampkit.precision import ModuleOverrides


def keep_in_fp32(model: nn.Module, path: str, *, device_type: str) -> nn.Module:
    """Run the modules `path` names in fp32 under autocast (see the module docstring); returns the model."""
    return ModuleOverrides.keep_fp32([path]).apply(model, device_type=device_type, restore_outputs=False)
