"""Non-finite locator: which module, in which phase, first produced an inf or a nan.

Hooks on every module record, per call, |x| statistics of the module's weights and inputs (a
forward pre-hook), its outputs (a forward hook), the gradients flowing in and out of it (tensor
hooks: `grad_hooks.py`) and its parameters' accumulated gradients (a post-accumulate-grad hook).
Each record is a `Frame`, kept in a bounded ring; the first frame holding a non-finite value is the
finding, reported with the frames that led to it. Because children finish before their parents
(forward) and a module's backward runs only after its consumers' (backward), the first
non-finite frame in time is the innermost module where the value appeared.

The backward side uses no module backward hooks: those wrap a module's outputs in views, which
breaks models that modify an output in place (Falcon's `mlp_output += attention_output`). The
gradient arriving at a module is a tensor hook on each output ("grad_output" frame, when it
arrives); the gradient it sends upstream is an identity autograd function around its positional
inputs ("grad_input" frame, once the module's backward has produced it).

Cost: every frame is a host-device sync (`.tolist()`), so the locator is a diagnostic mode, off by
default in `train` and attached by `--detect-nonfinite` or `doctor`. Off means no hooks at all.
"""

from __future__ import annotations

import functools
import math
import warnings
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ampkit.diagnostics.fp16 import FP16_FLUSH_AT, FP16_NEAR_MAX
from ampkit.diagnostics.grad_hooks import hook_outputs, probe_inputs
from ampkit.records import Record

ROOT = "(model)"
"""Display path of the root module (its dotted path is the empty string)."""

# A module whose inputs need no gradient (an embedding fed token ids) still gets its full backward
# hook, called with grad_input = (None,); torch warns about that on every such call.
_NO_INPUT_GRAD_WARNING = "Full backward hook is firing when gradients are computed with respect to module outputs"


@dataclass(frozen=True, kw_only=True)
class TensorStats(Record):
    """|x| statistics of the floating-point tensors at one site of one call (ints are skipped)."""

    numel: int
    absmin: float
    """smallest nonzero finite |x| (inf when there is none)"""
    absmax: float
    """largest finite |x| (0 when there is none)"""
    n_nan: int
    n_inf: int
    near_max: int
    """elements with |x| > 65504 / 2: one doubling from fp16 overflow"""
    fp16_flush: int
    """nonzero elements that a cast to fp16 turns into exact zeros (|x| <= 2^-25); 0 for fp16 tensors"""
    dtype: str

    @property
    def nonfinite(self) -> int:
        return self.n_nan + self.n_inf


@dataclass(frozen=True, kw_only=True)
class Frame:
    """One hook call: a module, a phase, and stats per site.

    Sites: forward pre-hook -> "weights", "inputs"; forward hook -> "outputs"; backward -> "grad_output"
    (arriving from the consumers, one frame per output), "grad_input" (what this module sends upstream);
    post-accumulate hook -> "param_grad".
    """

    index: int
    step: int
    module: str
    cls: str
    phase: str
    stats: dict[str, TensorStats]

    def sites_with(self, attribute: str) -> list[str]:
        return [site for site, s in self.stats.items() if getattr(s, attribute)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "step": self.step,
            "module": self.module,
            "cls": self.cls,
            "phase": self.phase,
            "stats": {site: s.to_dict() for site, s in self.stats.items()},
        }


@dataclass(frozen=True, kw_only=True)
class Finding:
    """Where something first went wrong: `kind` "nonfinite" or "near_fp16_max"."""

    kind: str
    module: str
    cls: str
    phase: str
    site: str
    step: int
    values: str
    """"inf", "nan", "inf+nan", or "|x| up to 1.2e+05"."""
    explanation: str
    frames: tuple[Frame, ...] = field(default=(), repr=False)

    def to_dict(self, *, frames: bool = True) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("kind", "module", "cls", "phase", "site", "step", "values", "explanation")}
        if frames:
            out["frames"] = [f.to_dict() for f in self.frames]
        return out


def _floating(tensors: Iterable[Any], *, detach: bool = True) -> list[torch.Tensor]:
    # An FSDP2 parameter's gradient is a DTensor: this rank's shard is what it holds (and checks).
    local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors)
    found = [t for t in local if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0]
    return [t.detach() for t in found] if detach else found


def _flatten(obj: Any) -> Iterator[Any]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _flatten(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _flatten(item)


def _range_row(a: torch.Tensor) -> torch.Tensor:
    """[smallest nonzero |x|, largest |x|] of |x| (nan/inf propagate into the max), on device."""
    inf = torch.full((), float("inf"), dtype=a.dtype, device=a.device)
    return torch.stack([torch.where(a > 0, a, inf).amin().double(), a.amax().double()])


_Row = tuple[float, float, int, int, int, int]
"""One tensor's [absmin, absmax, n_nan, n_inf, near_max, fp16_flush]."""


def _detail(t: torch.Tensor, a: torch.Tensor, absmin: float, absmax: float) -> _Row:
    """Counts, computed only when the cheap pass says they are nonzero (rare: a few extra syncs)."""
    n_nan = n_inf = near = flush = 0
    if not math.isfinite(absmax):
        finite = torch.isfinite(a)
        n_nan = int(torch.isnan(a).sum())
        n_inf = int((~finite).sum()) - n_nan
        absmax = float(torch.where(finite, a, torch.zeros((), dtype=a.dtype, device=a.device)).amax())
    if absmax > FP16_NEAR_MAX:
        near = int(((a > FP16_NEAR_MAX) & torch.isfinite(a)).sum())
    if absmin <= FP16_FLUSH_AT and t.dtype != torch.float16:  # fp16 tensors: what flushed is already gone
        flush = int(((a > 0) & (a <= FP16_FLUSH_AT)).sum())
    return (absmin, absmax, n_nan, n_inf, near, flush)


def _tensor_rows(floats: list[torch.Tensor]) -> list[_Row]:
    """Per tensor [absmin, absmax, n_nan, n_inf, near_max, fp16_flush]: a cheap pass (min/max of |x|,
    one sync for all tensors) decides which counts are needed; they almost never are, so a tensor
    costs about five small kernels."""
    mags = [t.abs() for t in floats]
    ranges = torch.stack([_range_row(a).to(floats[0].device) for a in mags]).tolist()  # sync point
    return [_detail(t, a, lo, hi) for t, a, (lo, hi) in zip(floats, mags, ranges)]


def _combine(floats: list[torch.Tensor], rows: list[_Row]) -> TensorStats:
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in floats})
    return TensorStats(
        numel=sum(t.numel() for t in floats),
        absmin=min(r[0] for r in rows),
        absmax=max(r[1] for r in rows),
        n_nan=sum(r[2] for r in rows),
        n_inf=sum(r[3] for r in rows),
        near_max=sum(r[4] for r in rows),
        fp16_flush=sum(r[5] for r in rows),
        dtype="+".join(dtypes),
    )


def tensor_stats(tensors: Iterable[Any]) -> TensorStats | None:
    """Combined stats of the floating tensors among `tensors`; None when there are none."""
    floats = _floating(tensors)
    return _combine(floats, _tensor_rows(floats)) if floats else None


class _RowCache:
    """Rows of recently seen tensors, so a tensor seen as one module's output and the next module's
    input (or the same weights at every call of a step) is measured once. Keyed by identity and
    `_version` (bumped by in-place writes such as the optimizer's); weak references, so no
    activation is kept alive by the cache."""

    def __init__(self, size: int = 256):
        self.size = size
        self.rows: dict[int, tuple[weakref.ref, int, _Row]] = {}

    def stats(self, tensors: Iterable[Any]) -> TensorStats | None:
        floats = _floating(tensors, detach=False)
        if not floats:
            return None
        cached = [self._get(t) for t in floats]
        missing = [i for i, r in enumerate(cached) if r is None]
        measured: dict[int, _Row] = {}
        if missing:
            measured = dict(zip(missing, _tensor_rows([floats[i].detach() for i in missing])))
            for i, row in measured.items():
                self._put(floats[i], row)
        return _combine(floats, [row if row is not None else measured[i] for i, row in enumerate(cached)])

    def _get(self, t: torch.Tensor) -> _Row | None:
        hit = self.rows.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2]
        return None

    def _put(self, t: torch.Tensor, row: _Row) -> None:
        if len(self.rows) >= self.size:
            self.rows.pop(next(iter(self.rows)))  # oldest first
        try:
            self.rows[id(t)] = (weakref.ref(t), t._version, row)
        except TypeError:  # a tensor subclass without weak references: just do not cache it
            pass


def _describe_values(stats: TensorStats) -> str:
    if stats.nonfinite:
        return "+".join(name for name, n in (("inf", stats.n_inf), ("nan", stats.n_nan)) if n)
    return f"|x| up to {stats.absmax:.3g}"


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ROOT


_NONFINITE_WHY = {
    ("forward", "weights"): "the weights of {m} already hold {v}: an earlier optimizer step wrote them "
    "(a non-finite gradient was applied)",
    ("forward", "inputs"): "the inputs of {m} were already {v}: produced by code outside any module, in {p}.forward",
    ("forward", "outputs"): "{m} ({c}) produced {v} in its forward output from finite inputs and weights",
    ("backward", "grad_output"): "the gradient arriving at the output of {m} was already {v}: produced by the "
    "backward of code outside any module, in {p}.forward",
    ("backward", "grad_input"): "the backward of {m} ({c}) turned a finite incoming gradient into {v}",
    ("backward", "param_grad"): "the accumulated gradient of {m}'s parameters holds {v}",
}
_NEAR_MAX_WHY = (
    "{m} ({c}) holds values near fp16's limit at its {s} ({v} > 65504 / 2): one doubling from overflow in fp16"
)


class NonFiniteLocator:
    """Attach to a model; after a step, `first_nonfinite` names the module and phase where an inf/nan
    first appeared, `first_near_max` the first site with |x| > 65504 / 2.

    Usage: `with NonFiniteLocator(model) as loc: ...train steps...` (or `attach()`/`detach()`).
    `begin_step(step)` tags frames with the caller's step number. Recording stops at the first
    non-finite frame (later frames only repeat the damage).
    """

    def __init__(self, model: nn.Module, *, ring_size: int = 32):
        if ring_size < 1:
            raise ValueError(f"ring_size must be >= 1, got {ring_size}")
        self.model = model
        self.ring: deque[Frame] = deque(maxlen=ring_size)
        self.step = 0
        self.first_nonfinite: Finding | None = None
        self.first_near_max: Finding | None = None
        self.limits: dict[tuple[str, str, str], dict[str, float]] = {}
        """(module, phase, site) -> worst |x| seen, near-max and fp16-flush counts (until the first non-finite)"""
        self._frames = 0
        self._cache = _RowCache()
        self._handles: list[Any] = []
        self._warning_scope: Any = None
        self._classes = {path: type(m).__name__ for path, m in model.named_modules()}

    # -- lifecycle -------------------------------------------------------------------------
    def attach(self) -> NonFiniteLocator:
        if self._handles:
            return self
        # Scoped to the attachment: the filter is removed again by `detach` (catch_warnings restores
        # the process's filter list as it was).
        self._warning_scope = warnings.catch_warnings()
        self._warning_scope.__enter__()
        warnings.filterwarnings("ignore", message=_NO_INPUT_GRAD_WARNING)
        try:
            self._register()
        except BaseException:  # a module that refuses hooks (a ScriptModule): none stays registered
            self.detach()
            raise
        return self

    def _register(self) -> None:
        for path, module in self.model.named_modules():
            # one at a time, so a refusal leaves every handle registered so far in `_handles` for `detach`
            # first of the pre-hooks: its probe is the outermost, so it sees what a fault
            # injector's (registered after it in order) did to the gradient
            probe = functools.partial(self._probe_inputs, path)
            self._handles.append(module.register_forward_pre_hook(probe, prepend=True))
            pre = functools.partial(self._on_forward_pre, path)
            self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(functools.partial(self._on_forward, path)))
        for name, param in self.model.named_parameters():  # tied weights appear once, under their first owner
            if param.requires_grad:
                owner = name.rsplit(".", 1)[0] if "." in name else ""
                self._handles.append(
                    param.register_post_accumulate_grad_hook(functools.partial(self._on_param_grad, owner))
                )

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._warning_scope is not None:
            self._warning_scope.__exit__(None, None, None)
            self._warning_scope = None

    def __enter__(self) -> NonFiniteLocator:
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()

    def begin_step(self, step: int) -> None:
        self.step = step

    def resume(self) -> None:
        """Forget the non-finite finding (it was handled, e.g. a loss-scaler skip) and keep recording."""
        self.first_nonfinite = None
        self.ring.clear()

    def reset(self) -> None:
        """Forget findings and frames (keeps the hooks)."""
        self.ring.clear()
        self.first_nonfinite = self.first_near_max = None
        self.limits = {}

    @property
    def done(self) -> bool:
        return self.first_nonfinite is not None

    # -- hooks -----------------------------------------------------------------------------
    def _on_forward_pre(self, path: str, module: nn.Module, args, kwargs) -> None:
        if self.done:
            return
        stats = {
            "weights": self._cache.stats(module.parameters(recurse=False)),
            "inputs": self._cache.stats(_flatten((args, kwargs))),
        }
        self._record(path, "forward", stats)

    def _on_forward(self, path: str, module: nn.Module, args, output) -> None:
        if not self.done:
            self._record(path, "forward", {"outputs": self._cache.stats(_flatten(output))})
            hook_outputs(output, functools.partial(self._on_grad_output, path))

    def _probe_inputs(self, path: str, module: nn.Module, args) -> tuple | None:
        if self.done:
            return None
        return probe_inputs(args, functools.partial(self._on_grad_input, path))

    def _on_grad_output(self, path: str, grad: torch.Tensor) -> None:
        if not self.done:
            self._record(path, "backward", {"grad_output": self._cache.stats([grad])})

    def _on_grad_input(self, path: str, grads: tuple) -> None:
        if not self.done:
            self._record(path, "backward", {"grad_input": self._cache.stats(_flatten(grads))})

    def _on_param_grad(self, owner: str, param: torch.Tensor) -> None:
        if not self.done:
            self._record(owner, "backward", {"param_grad": tensor_stats([param.grad])})

    # -- bookkeeping -----------------------------------------------------------------------
    def _record(self, path: str, phase: str, stats: dict[str, TensorStats | None]) -> None:
        present = {site: s for site, s in stats.items() if s is not None}
        if not present:
            return
        frame = Frame(
            index=self._frames,
            step=self.step,
            module=path or ROOT,
            cls=self._classes.get(path, "?"),
            phase=phase,
            stats=present,
        )
        self._frames += 1
        self.ring.append(frame)
        self._note_limits(frame)
        bad = frame.sites_with("nonfinite")
        if bad:  # sites are listed in the order the values arrived: the first one is the origin
            self.first_nonfinite = self._finding("nonfinite", frame, bad[0])
        elif self.first_near_max is None and (near := frame.sites_with("near_max")):
            self.first_near_max = self._finding("near_fp16_max", frame, near[0])

    def _note_limits(self, frame: Frame) -> None:
        for site, s in frame.stats.items():
            if not (s.near_max or s.fp16_flush):
                continue
            entry = self.limits.setdefault(
                (frame.module, frame.phase, site), {"absmax": 0.0, "near_max": 0, "fp16_flush": 0, "numel": 0}
            )
            entry["absmax"] = max(entry["absmax"], s.absmax)
            entry["near_max"] += s.near_max
            entry["fp16_flush"] += s.fp16_flush
            entry["numel"] += s.numel

    def _finding(self, kind: str, frame: Frame, site: str) -> Finding:
        values = _describe_values(frame.stats[site])
        template = _NONFINITE_WHY[(frame.phase, site)] if kind == "nonfinite" else _NEAR_MAX_WHY
        why = template.format(m=frame.module, c=frame.cls, v=values, p=_parent(frame.module), s=site)
        return Finding(
            kind=kind,
            module=frame.module,
            cls=frame.cls,
            phase=frame.phase,
            site=site,
            step=frame.step,
            values=values,
            explanation=why,
            frames=tuple(self.ring),
        )

    def summary(self, *, frames: bool = True) -> dict[str, Any]:
        """JSON-ready: the findings (with their frame rings) and the sites near fp16's limits."""
        return {
            "first_nonfinite": self.first_nonfinite.to_dict(frames=frames) if self.first_nonfinite else None,
            "first_near_fp16_max": self.first_near_max.to_dict(frames=False) if self.first_near_max else None,
            "near_limits": [{"module": m, "phase": p, "site": s, **v} for (m, p, s), v in self.limits.items()],
        }
