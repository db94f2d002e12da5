"""A precision per module: module-path patterns mapped to a regime, applied by the policy.

One object (`ModuleOverrides`) for every way a user keeps part of a model in another precision:
`--keep-fp32 PATTERNS` (its shorthand, every pattern `=fp32`), a bench candidate's `@PATTERN=REGIME`
(`bench/candidates.py`), doctor's advised fix (`diagnostics.keep_in_fp32`). The policy holds it and
applies it in `convert_module`, when it prepares the model, so the loop never asks which module runs
in which dtype.

Patterns (each resolved on the model; one that matches nothing is a one-line UsageError):
    blocks.1.mlp      an exact module path (`model.named_modules()`)
    blocks.*.mlp      an fnmatch glob over module paths (the outermost matches only)
    vision            a VLM's part name (vision, projector, language): the part's root modules, found
                      as `--freeze` finds them (`models.hf_vlm.find_parts`)

Regimes, each a subtree in its own dtype with autocast off inside it:
    fp32              an fp32 island: its weights fp32, its floating inputs upcast to fp32, every op
                      inside in fp32 (the module-level `torch.amp.custom_fwd(cast_inputs=float32)`)
    bf16-true, fp16-true
                      the subtree's weights (so its gradients and optimizer states) cast to that
                      dtype, its floating inputs too
Outputs: under an autocast policy (bf16-mixed, fp16-mixed, the low-bit formats) as the subtree
produced them (autocast casts them for the next op); under a policy without autocast (fp32, tf32, the
-true regimes) cast back to the dtype the subtree's first floating input came in, as the ops after
it need. Backward follows the forward's dtypes. The module's own forward is wrapped in place (an
instance-level `forward` with a `with` block, which torch.compile traces): the module keeps its path,
class and state_dict keys (checkpoints load), its hooks run around the region, and `copy.deepcopy`
of the model copies the region with it.

Hazards: an island on a part covers its roots' whole subtrees (mllama's cross-attention layers, the
projector part, sit inside the language model: `language=fp32` covers them too); the low-bit formats
leave an overridden subtree's Linears unconverted; TF32 is a global switch, which an island does not
change.
"""

from __future__ import annotations

import difflib
import fnmatch
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.precision.casting import cast_floating
from ampkit.precision.table import SPECS, canonical_name

ISLAND = "fp32"
REGIMES = tuple(s.name for s in SPECS.values() if not s.autocast and not s.tf32 and not s.converts_linears)
"""what a module may be kept in: fp32 (an island) and the -true regimes' dtypes"""
PART_NAMES = ("vision", "projector", "language")
"""`models.hf_vlm.PARTS` (written out: a test checks the two agree)"""
_GLOB = set("*?[")
MARK = "_ampkit_precision_override"
"""attribute an overridden module carries (its `_Region`: `.regime`): applying twice does nothing more"""


@dataclass(frozen=True)
class ModuleOverride:
    """One pattern and the regime its modules run in."""

    pattern: str
    regime: str

    @property
    def dtype(self) -> torch.dtype:
        return SPECS[self.regime].param_dtype

    def __str__(self) -> str:
        return f"{self.pattern}={self.regime}"


def _regime(text: str, item: str) -> str:
    try:
        name = canonical_name(text)
    except UsageError:
        name = ""
    if name not in REGIMES:
        raise UsageError(f"{item!r}: {text.strip()!r} is not a module regime; choose one of: {', '.join(REGIMES)}")
    return name


@dataclass(frozen=True)
class ModuleOverrides:
    """The overrides of one run, in order (a later pattern's regime wins on a module both match)."""

    items: tuple[ModuleOverride, ...] = ()

    @classmethod
    def parse(cls, text: str, *, separator: str = ",") -> ModuleOverrides:
        """'vision=fp32,blocks.*.mlp=bf16-true' -> overrides ('' -> none); bad items: one line."""
        items = []
        for item in (p.strip() for p in text.split(separator)):
            if not item:
                continue
            pattern, sep, regime = item.partition("=")
            if not sep or not pattern.strip():
                raise UsageError(f"module override {item!r}: write PATTERN=REGIME, e.g. vision=fp32")
            items.append(ModuleOverride(pattern.strip(), _regime(regime, item)))
        return cls(tuple(items))

    @classmethod
    def keep_fp32(cls, patterns: str | Iterable[str]) -> ModuleOverrides:
        """`--keep-fp32 a,b.*`: each pattern an fp32 island."""
        names = patterns.split(",") if isinstance(patterns, str) else patterns
        return cls(tuple(ModuleOverride(p.strip(), ISLAND) for p in names if p.strip()))

    def __add__(self, other: ModuleOverrides) -> ModuleOverrides:
        return ModuleOverrides(self.items + other.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __str__(self) -> str:
        return ",".join(str(o) for o in self.items)

    def to_dict(self) -> dict[str, str]:
        """pattern -> regime, as summaries record them."""
        return {o.pattern: o.regime for o in self.items}

    def resolve(self, model: nn.Module) -> dict[str, ModuleOverride]:
        """Module path -> its override, the outermost modules each pattern matches; a pattern matching
        no module is a UsageError naming it and a few of the model's modules."""
        out: dict[str, ModuleOverride] = {}
        for override in self.items:
            for path in resolve_pattern(model, override.pattern):
                out[path] = override
        return out

    def apply(self, model: nn.Module, *, device_type: str, restore_outputs: bool) -> nn.Module:
        """Cast and hook every matched subtree (module docstring); returns `model`, changed in place.
        `restore_outputs`: cast outputs back to the incoming dtype (a policy without autocast)."""
        for path, override in self.resolve(model).items():
            module = model.get_submodule(path)
            if getattr(module, MARK, None) is not None:
                continue  # already applied (a deep copy of a prepared model)
            _cast_subtree(module, override.dtype)
            inner = module.__dict__.get("forward")  # an instance-level forward already there (rare)
            region = _Region(override.regime, device_type, override.dtype, restore_outputs, inner=inner)
            setattr(module, MARK, region)
            module.forward = types.MethodType(_region_forward, module)
        return model

    def parameters_by_dtype(self, model: nn.Module) -> dict[str, torch.dtype]:
        """Parameter name -> the dtype an override stores it in (only overridden parameters; a tied
        weight once, under its first name in `model.named_parameters()`)."""
        first = {id(p): name for name, p in model.named_parameters()}
        out: dict[str, torch.dtype] = {}
        for path, override in self.resolve(model).items():
            for param in model.get_submodule(path).parameters():
                out[first[id(param)]] = override.dtype
        return out


def applied_note(applied: dict[str, str], *, limit: int = 3) -> str:
    """One console line for what a policy applied (path -> regime): "module precision: fp32: blocks.0.mlp,
    blocks.1.mlp and 2 more"; the first `limit` paths of each regime named, the rest counted."""
    by_regime: dict[str, list[str]] = {}
    for path, regime in applied.items():
        by_regime.setdefault(regime, []).append(path)
    parts = []
    for regime, paths in by_regime.items():
        more = len(paths) - limit
        parts.append(f"{regime}: {', '.join(paths[:limit])}" + (f" and {more} more" if more > 0 else ""))
    return "module precision: " + "; ".join(parts)


def resolve_pattern(model: nn.Module, pattern: str) -> tuple[str, ...]:
    """The module paths `pattern` names (module docstring): an exact path, else a part name, else a
    glob (the outermost matches)."""
    modules = [name for name, _ in model.named_modules() if name]
    if pattern in modules:
        return (pattern,)
    if pattern in PART_NAMES:
        from ampkit.models.hf_vlm import find_parts

        parts = find_parts(model).roots
        if parts.get("vision") and parts.get(pattern):  # a VLM: a causal LM's lm_head is no "language" part
            return parts[pattern]
    if _GLOB & set(pattern):
        matched = [n for n in modules if fnmatch.fnmatchcase(n, pattern)]
        outer = tuple(n for n in matched if not any(n.startswith(m + ".") for m in matched))
        if outer:
            return outer
    raise UsageError(f"module pattern {pattern!r} matches no module of the model; {_examples(modules, pattern)}")


def _examples(modules: list[str], pattern: str) -> str:
    close = difflib.get_close_matches(pattern, modules, n=3, cutoff=0.6)
    shown = close or modules[:2] + modules[len(modules) // 2 : len(modules) // 2 + 1] + modules[-1:]
    return f"its modules include: {', '.join(shown)} ({len(modules)} in all; globs and vision/projector/language work)"


def _cast_subtree(module: nn.Module, dtype: torch.dtype) -> None:
    """The subtree's floating parameters and buffers in `dtype`; untouched when they already are
    (`Module.to` would swap every parameter, which a planner's fake tensor refuses)."""
    tensors = [*module.parameters(), *module.buffers()]
    if any(t.is_floating_point() and t.dtype != dtype for t in tensors):
        module.to(dtype=dtype)


def _first_floating(obj: Any) -> torch.dtype | None:
    if isinstance(obj, torch.Tensor):
        return obj.dtype if obj.is_floating_point() else None
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (tuple, list)) else ()
    return next((d for d in map(_first_floating, values) if d is not None), None)


@dataclass(frozen=True)
class _Region:
    """How one overridden module runs: its regime, the dtype of its inputs, whether outputs go back."""

    regime: str
    device_type: str
    dtype: torch.dtype
    restore_outputs: bool
    inner: Callable[..., Any] | None = None
    """an instance-level forward the module already had (None: its class's); a deep copy rebinds it"""


def _region_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The overridden module's forward (bound to it as `module.forward`): inputs cast, autocast off,
    outputs back to their incoming dtype where the region says so. A plain function with a `with`
    block, so torch.compile traces it (hooks entering autocast by hand break dynamo) and a deep copy
    of the model rebinds it to the copy (`copy` deep-copies bound methods with their instance)."""
    region: _Region = getattr(self, MARK)
    incoming = _first_floating((args, kwargs)) if region.restore_outputs else None
    forward = region.inner or type(self).forward.__get__(self)
    with torch.autocast(region.device_type, enabled=False):
        out = forward(*cast_floating(args, region.dtype), **cast_floating(kwargs, region.dtype))
    return cast_floating(out, incoming) if incoming is not None and incoming != region.dtype else out
