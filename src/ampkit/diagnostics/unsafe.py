"""A deliberately fp16-unsafe custom op, for tests and the `doctor` demo.

`NaiveExpGate` is the kind of hand-written op that sits outside autocast's lists: a softmax gate
computed as exp(z) / sum(exp(z)) without subtracting the max, its scores clamped at 60 by an author
who had fp32 in mind. `torch.exp` has no autocast rule, so under fp16 autocast it runs in the dtype
of its input, the fp16 output of a Linear: exp(z) overflows to inf once z > 11.09
(e^11.09 ~ 65504) and inf / inf = nan. In fp32 and bf16 (fp32's exponent range) e^60 ~ 1e26 is
finite, so the same model trains there. The seeds' 13B
LoRA run died the same way, in a custom RoPE kernel.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ampkit.diagnostics.inject import resolve_module
from ampkit.errors import UsageError


class _Width(Protocol):
    @property
    def d_model(self) -> int: ...


@runtime_checkable
class _Configured(Protocol):
    """A model that describes itself: ampkit's `LlamaLM` (a ModelConfig) and `HFCausalLM` (an HFModelInfo)."""

    @property
    def config(self) -> _Width: ...


class NaiveExpGate(nn.Module):
    """y = inner(x) * d * softmax(gain * score(x)), with the softmax written naively (no max shift).

    With the default gain, scores reach ~15 on the tiny model at initialization: fine in fp32,
    nan under fp16 autocast from the first step.
    """

    def __init__(self, inner: nn.Module, d_model: int, *, gain: float = 24.0):
        super().__init__()
        self.inner = inner
        self.score = nn.Linear(d_model, d_model, bias=False)
        self.gain = gain
        nn.init.normal_(self.score.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.score(x) * self.gain  # fp16 under fp16 autocast (Linear is on the fp16 list)
        z = z.clamp(max=60.0)  # the author's guard: it keeps exp inside fp32's range (e^88), not fp16's
        e = torch.exp(z)  # hazard: not on any autocast list, so it stays fp16 and overflows past z ~ 11.09
        gate = e / e.sum(-1, keepdim=True)  # inf / inf = nan
        return self.inner(x) * gate * x.shape[-1]


def insert_unsafe_op(model: nn.Module, path: str = "blocks.1.mlp", *, gain: float = 24.0) -> nn.Module:
    """Replace the module at `path` (e.g. a block's MLP) by a `NaiveExpGate` wrapping it; returns the model.

    The gate's width is the model's `config.d_model`. The gate's score weights are drawn from the
    global RNG: seed it first for a reproducible model.
    """
    inner = resolve_module(model, path)
    parent_path, _, name = path.rpartition(".")
    parent = resolve_module(model, parent_path) if parent_path else model
    if not isinstance(model, _Configured):
        raise UsageError(f"{type(model).__name__} has no `config.d_model` to size the unsafe op by")
    gate = NaiveExpGate(inner, model.config.d_model, gain=gain)
    param = next(inner.parameters(), None)
    if param is not None:
        gate.score.to(device=param.device, dtype=param.dtype)
    setattr(parent, name, gate)
    return model
