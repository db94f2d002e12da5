"""Are a transformers model's decoder layers identical? Their pattern, and copies of fewer layers.

The traced ledger of a deep model is extrapolated from traces of shallow copies (`plan/traced/extrapolate.py`),
which is exact only when the layers that are dropped are like the ones kept. This module checks that
assumption on the model itself, built on the meta device at its configured depth: each decoder layer's
*signature* is its submodules' classes, their parameters' and buffers' names and shapes (not their
dtypes: a precision policy changes those for every layer alike), the
plain attributes they set from the config (`sliding_window`, `is_sliding`, `attention_type`, ... but
not the layer's own index) and the config's `layer_types` entry for that layer. Layers with one
signature are identical; otherwise the signatures may still repeat (Gemma 2 alternates sliding-window
and global attention: a period of 2; DeepSeek-V3 has `first_k_dense_replace` dense layers, then MoE
ones: a prefix, then a period of 1). `LayerPattern` is the shortest prefix + period that describes
the sequence; the tracer then traces copies with one and two repeats of the period.

`config_at_depth` makes such a copy: `num_hidden_layers` changed, and every per-layer list of the
config (`layer_types`, ...) cut to the new depth, which keeps a prefix + period sequence's pattern;
`check_copy` confirms the copy's layers have the expected signatures (a config that places layers by
index, such as `mlp_only_layers`, would not, and the caller then traces the model in full).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import nn

_INDEX_ATTRIBUTES = {"layer_idx", "layer_id", "layer_index", "layer_number", "idx", "training"}
_PLAIN = (bool, int, float, str, type(None))


def _plain_attributes(module: nn.Module) -> tuple[tuple[str, Any], ...]:
    return tuple(
        sorted(
            (k, v)
            for k, v in vars(module).items()
            if not k.startswith("_") and k not in _INDEX_ATTRIBUTES and isinstance(v, _PLAIN)
        )
    )


def layer_signature(layer: nn.Module, layer_type: Any = None) -> tuple:
    """What makes two decoder layers the same: structure, shapes and config-set attributes."""
    parts: list[Any] = [("layer_type", layer_type)]
    for name, module in layer.named_modules():
        params = tuple((n, tuple(p.shape)) for n, p in module.named_parameters(recurse=False))
        buffers = tuple((n, tuple(b.shape)) for n, b in module.named_buffers(recurse=False))
        parts.append((name, type(module).__name__, params, buffers, _plain_attributes(module)))
    return tuple(parts)


def layer_signatures(layers: nn.ModuleList | list[nn.Module], config: Any) -> list[tuple]:
    types = getattr(config, "layer_types", None)
    per_layer = list(types) if isinstance(types, (list, tuple)) and len(types) == len(layers) else [None] * len(layers)
    return [layer_signature(layer, kind) for layer, kind in zip(layers, per_layer)]


@dataclass(frozen=True, kw_only=True)
class LayerPattern:
    """The decoder layers as `prefix` distinct layers, then a `period` of layers repeated, then the
    first `remainder` layers of one more period. Identical layers: prefix 0, period 1."""

    n_layers: int
    prefix: int = 0
    period: int = 1
    kinds: tuple[str, ...] = ()
    """a short name per layer, in order (the distinct signatures numbered: "A", "B", ...)"""
    found: bool = True
    """False: the signatures follow no prefix + period pattern (the model is traced in full)"""

    @property
    def identical(self) -> bool:
        return self.found and self.prefix == 0 and self.period == 1

    @property
    def repeats(self) -> int:
        return (self.n_layers - self.prefix) // self.period if self.found else 0

    @property
    def remainder(self) -> int:
        return (self.n_layers - self.prefix) % self.period if self.found else 0

    def depth(self, repeats: int) -> int:
        """Layers of a copy with `repeats` periods (prefix and remainder kept)."""
        return self.prefix + repeats * self.period + self.remainder

    @property
    def extrapolable(self) -> bool:
        """Tracing 1 and 2 periods is cheaper than tracing the model (a trace costs about as much
        outside the layers as in a few of them: at least 4 periods)."""
        return self.found and self.repeats >= 4

    def describe(self) -> str:
        if self.identical:
            return f"the {self.n_layers} decoder layers are identical"
        if not self.found:
            return f"the {self.n_layers} decoder layers differ ({''.join(self.kinds)}) with no repeating pattern"
        pre = f"{self.prefix} leading layer(s) ({''.join(self.kinds[: self.prefix])}), then " if self.prefix else ""
        period = "".join(self.kinds[self.prefix : self.prefix + self.period])
        return (
            f"the decoder layers differ: {pre}a pattern of {self.period} ({period}) repeated {self.repeats} times"
            + (f" and {self.remainder} more" if self.remainder else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_layers": self.n_layers,
            "identical": self.identical,
            "prefix": self.prefix,
            "period": self.period,
            "found": self.found,
            "kinds": "".join(self.kinds),
            "description": self.describe(),
        }


def _kinds(signatures: list[tuple]) -> tuple[str, ...]:
    names: dict[tuple, str] = {}
    for sig in signatures:
        names.setdefault(sig, chr(ord("A") + len(names) % 26))
    return tuple(names[s] for s in signatures)


def find_pattern(signatures: list[tuple]) -> LayerPattern:
    """The shortest prefix + period describing the sequence (prefix + period as small as can be)."""
    kinds = _kinds(signatures)
    n = len(kinds)
    for size in range(1, n + 1):  # prefix + period, smallest first
        for period in range(1, size + 1):
            prefix = size - period
            tail = kinds[prefix:]
            if all(tail[i] == tail[i % period] for i in range(len(tail))):
                return LayerPattern(n_layers=n, prefix=prefix, period=period, kinds=kinds)
    return LayerPattern(n_layers=n, kinds=kinds, found=False)  # unreachable: size n always matches


def model_pattern(layers: nn.ModuleList | list[nn.Module] | None, config: Any) -> LayerPattern:
    if not layers:
        return LayerPattern(n_layers=0, found=False)
    return find_pattern(layer_signatures(layers, config))


def config_at_depth(config: Any, depth: int) -> Any:
    """A copy of a transformers config with `depth` decoder layers and its per-layer lists cut to it."""
    n = int(config.num_hidden_layers)
    out = copy.deepcopy(config)
    for key, value in list(vars(out).items()):
        if isinstance(value, (list, tuple)) and len(value) == n and key != "architectures":
            setattr(out, key, type(value)(value[:depth]))
    out.num_hidden_layers = depth  # transformers' attribute_map turns this into n_layer, num_layers, ...
    return out


def check_copy(expected: list[tuple], layers: nn.ModuleList | list[nn.Module] | None, config: Any) -> bool:
    """True when a shallow copy's layers have the signatures of the model's first layers."""
    got = layer_signatures(layers or [], config)
    return got == expected[: len(got)] and len(got) == int(config.num_hidden_layers)
