"""The range audit: per module, the largest |activation|, |weight| and |gradient x loss scale| of the
fp32 model against the diagnosed precision's range (`diagnostics.range_target`: fp16, bf16 or fp32).

fp16 holds magnitudes up to 65504 (`formats`: fp16's `finfo.max`) and normal values down to 2^-14 =
6.1e-5 (`finfo.smallest_normal`); bf16 and fp32 reach ~3.4e38. A model whose fp32 activations or
weights exceed 65504 somewhere (SigLIP vision towers: biases near 5.4e4, poolers reaching ~8e4)
overflows to inf the moment that part runs in fp16, whatever the loss scale (the scale only touches
the backward). The audit finds that part before any training step: a few fp32 batches go through the
task's own forward-and-loss (`core.policy_loss`, the fp32 policy) and its backward with a forward
pre-hook and a forward hook on every module, which record per module
- `output_max`: the largest finite |x| of its floating outputs (tuples, dicts, model outputs walked);
- `input_max`: the same of its floating inputs (positional and keyword);
- `weight_max`: the largest |w| of its own parameters (not its children's);
- `underflow_fraction`: the share of its nonzero outputs below the format's smallest normal (subnormal
  or flushed to zero there: they lose precision or vanish);
- the backward's side, |gradient| x the initial loss scale (`diagnostics.range_grads`).
The text below says fp16, the usual target; every bound is the target format's (`RangeTarget`).
Headroom is log2(65504 / max |x|) in bits: how many doublings (a residual add, a larger input) the
largest value can take before fp16 overflows; below 0 the value is already out of range.

A module is *over* when its headroom is below 0 and *near* when below `NEAR_BITS` (1 bit: one doubling
from overflow). An *origin* is a flagged module whose own inputs fit (the large value is born there),
or whose own weights are flagged. Each origin is named at its *fix unit*: the innermost repeated block
holding it (the task's `repeated_blocks`, or any `nn.ModuleList` item: a ViT's `encoder.layers.N`), or
the origin itself outside any block; a unit that holds another unit is dropped (the deeper one says
more). The fix: keep that unit in fp32 (`--keep-fp32 PATH`), or use bf16, which has fp32's range.

A target wider than fp16 (bf16, fp32) adds a note naming the units over fp16's max: why fp16 would fail.
Cost: a few forward and backward passes in fp32; statistics stay on the device until the end (one
sync per side).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ampkit.core import policy_loss
from ampkit.diagnostics.range_grads import (
    GradOverflow,
    GradRangeRecorder,
    fitting_scale,
    grad_overflows,
    largest_grad,
    with_gradients,
)
from ampkit.diagnostics.range_target import FP16, NEAR_BITS, RangeTarget
from ampkit.diagnostics.range_target import status_of as _status
from ampkit.records import Record

ROOT = "(model)"
"""Display path of the root module (as the locator names it)."""


def fp16_limits() -> tuple[float, float]:
    """(largest finite, smallest normal) of fp16, from the format registry: 65504.0 and 2^-14."""
    return FP16.max, FP16.smallest_normal


def headroom_bits(max_abs: float | None, target: RangeTarget = FP16) -> float | None:
    """log2(target max / max_abs): doublings left before overflow (< 0: already over); None when nothing
    nonzero was seen (no value to overflow)."""
    return target.headroom_bits(max_abs)


@dataclass(frozen=True, kw_only=True)
class ModuleRange(Record):
    """One module's range over the audited batches (magnitudes in the model's units; None: not seen)."""

    name: str
    cls: str
    calls: int
    """forward calls seen (0: a module that holds weights but was never called)"""
    output_max: float | None
    input_max: float | None
    weight_max: float | None
    output_headroom_bits: float | None
    weight_headroom_bits: float | None
    headroom_bits: float | None
    """the smaller of the two: the module's margin below fp16's max"""
    underflow_fraction: float | None
    """share of its nonzero outputs below fp16's smallest normal (subnormal or flushed in fp16)"""
    weight_underflow_fraction: float | None
    """share of its nonzero weights below fp16's smallest normal"""
    status: str
    """"over" (headroom < 0), "near" (< NEAR_BITS) or "ok" (fits)"""
    output_grad_max: float | None = None
    """largest true-scale |gradient| at its outputs (None: no backward reached it)"""
    weight_grad_max: float | None = None
    """largest true-scale |gradient| of its own parameters"""
    grad_scaled_max: float | None = None
    """the larger of the two x the initial loss scale: what the backward holds (`diagnostics.range_grads`)"""


@dataclass(frozen=True, kw_only=True)
class RangeOffender(Record):
    """A fix unit whose range does not fit the format: where to keep fp32, with the evidence."""

    module: str
    """the fix unit's path (a repeated block, or the origin outside any block)"""
    origin: str
    """the innermost module where the out-of-range value is born"""
    site: str
    """"outputs" or "weights": which of the origin's ranges is flagged"""
    max_abs: float
    """the largest flagged |x| in the unit (the one its headroom is of)"""
    headroom_bits: float
    """the unit's smallest headroom, bits (< 0: over the format's max)"""
    status: str
    """"over" or "near" (headroom below NEAR_BITS)"""
    kept_fp32: bool
    """already inside a --keep-fp32 path (the audit ran in fp32, so it still sees the range)"""
    fix: str


@dataclass(frozen=True, kw_only=True)
class RangeAudit(Record):
    """summary.json's `range_audit`: every module's range, and the fix units that do not fit the format."""

    format: str
    """the diagnosed precision's format (`diagnostics.range_target`): fp16, bf16 or fp32"""
    max: float
    smallest_normal: float
    near_bits: float
    batches: int
    modules: list[ModuleRange]
    """every module with a forward call or weights, in first-call order"""
    offenders: list[RangeOffender]
    """fix units, smallest headroom first"""
    min_headroom_bits: float | None
    """the smallest headroom of any module (None: nothing measured)"""
    tightest: str | None
    """the module with that headroom"""
    notes: list[str] = field(default_factory=list)
    loss_scale: float = 1.0
    """the initial loss scale the gradients are multiplied by (1: no scaler)"""
    grad_max: float | None = None
    """the largest true-scale |gradient| of any module (None: no backward)"""
    fitting_scale: float | None = None
    """the largest power-of-two initial loss scale under which every audited gradient fits the format"""
    grad_overflows: list[GradOverflow] = field(default_factory=list)
    """modules whose |gradient| x `loss_scale` exceeds the format's max, least headroom first"""


def floating_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The floating-point tensors in a module's inputs or outputs: tensors, tuples, lists, dicts
    (a Hugging Face ModelOutput is one), dataclasses."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from floating_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from floating_tensors(item)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from floating_tensors(getattr(obj, name, None))


class _Sums:
    """One module's running statistics, on the device: [max finite |x|, n below smallest normal, n nonzero]."""

    def __init__(self) -> None:
        self.out: torch.Tensor | None = None
        self.inp: torch.Tensor | None = None
        self.calls = 0

    @staticmethod
    def row(tensors: Iterable[torch.Tensor], normal: float) -> torch.Tensor | None:
        rows = []
        for x in tensors:
            a = x.detach().abs().float()
            a = torch.where(torch.isfinite(a), a, torch.zeros((), device=a.device))  # an fp32 inf is the locator's
            nonzero = a > 0
            small = (nonzero & (a < normal)).sum()
            rows.append(torch.stack([a.amax() if a.numel() else a.new_zeros(()), small.float(), nonzero.sum().float()]))
        if not rows:
            return None
        stacked = torch.stack(rows)
        return torch.stack([stacked[:, 0].amax(), stacked[:, 1].sum(), stacked[:, 2].sum()])

    @staticmethod
    def merge(old: torch.Tensor | None, new: torch.Tensor | None) -> torch.Tensor | None:
        if new is None or old is None:
            return old if new is None else new
        return torch.stack([torch.maximum(old[0], new[0]), old[1] + new[1], old[2] + new[2]])


class RangeRecorder:
    """Forward hooks on every module of `model`, summing each call's input and output ranges."""

    def __init__(self, model: nn.Module, target: RangeTarget = FP16):
        self.model = model
        self.target = target
        self.names = {id(m): (name or ROOT) for name, m in model.named_modules()}
        self.sums: dict[str, _Sums] = {}  # insertion order: first call
        self._normal = target.smallest_normal
        self._handles: list[Any] = []

    def attach(self) -> RangeRecorder:
        for module in self.model.modules():
            name = self.names[id(module)]
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(name), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            sums = self.sums.setdefault(name, _Sums())
            sums.inp = _Sums.merge(sums.inp, _Sums.row(floating_tensors((args, kwargs)), self._normal))

        return hook

    def _hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            sums = self.sums.setdefault(name, _Sums())
            sums.calls += 1
            sums.out = _Sums.merge(sums.out, _Sums.row(floating_tensors(output), self._normal))

        return hook

    def ranges(self) -> list[ModuleRange]:
        """Every called module, then every uncalled one holding weights; one host sync for all."""
        modules = {self.names[id(m)]: m for m in self.model.modules()}
        names = [*self.sums, *(n for n, m in modules.items() if n not in self.sums and _own_params(m))]
        weights = [_Sums.row(_own_params(modules[n]), self._normal) for n in names]
        rows = [[self.sums[n].out, self.sums[n].inp] if n in self.sums else [None, None] for n in names]
        flat = [t for pair in rows for t in pair] + weights
        device = next((t.device for t in flat if t is not None), torch.device("cpu"))
        empty = torch.full((3,), math.nan, device=device)  # not measured
        stacked = [
            t.to(device) if t is not None else empty for t in flat
        ]  # a model split over devices: gathered on one
        host = torch.stack(stacked).tolist() if stacked else []  # the sync
        out = []
        for i, name in enumerate(names):
            out_row, in_row, w_row = host[2 * i], host[2 * i + 1], host[2 * len(names) + i]
            calls = self.sums[name].calls if name in self.sums else 0
            out.append(_module_range(name, type(modules[name]).__name__, calls, (out_row, in_row, w_row), self.target))
        return out


def _own_params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in module.parameters(recurse=False) if p.is_floating_point()]


def _max_of(row: list[float]) -> float | None:
    return None if math.isnan(row[0]) else row[0]


def _share(row: list[float]) -> float | None:
    return None if math.isnan(row[0]) or row[2] == 0 else row[1] / row[2]


def _module_range(name: str, cls: str, calls: int, rows, target: RangeTarget) -> ModuleRange:
    out_row, in_row, w_row = rows
    out_h, w_h = target.headroom_bits(_max_of(out_row)), target.headroom_bits(_max_of(w_row))
    both = [h for h in (out_h, w_h) if h is not None]
    head = min(both) if both else None
    return ModuleRange(
        name=name,
        cls=cls,
        calls=calls,
        output_max=_max_of(out_row),
        input_max=_max_of(in_row),
        weight_max=_max_of(w_row),
        output_headroom_bits=out_h,
        weight_headroom_bits=w_h,
        headroom_bits=head,
        underflow_fraction=_share(out_row),
        weight_underflow_fraction=_share(w_row),
        status=target.status(head),
    )


_RANK = {"ok": 0, "near": 1, "over": 2}
UNDERFLOW_NOTE = 0.1
"""A module with over 10% of its nonzero outputs below fp16's smallest normal gets a note. Lower shares are
the small tail of any activation (the tiny LM's MLPs: ~1.5%), below the rounding error of its large values."""


def origin_sites(m: ModuleRange, target: RangeTarget = FP16) -> list[tuple[str, float]]:
    """The sites ("weights", "outputs") where a flagged value is born in `m`, with their headroom: its own
    weights are flagged, or its outputs are flagged and worse than its inputs (a value passed on is not born here)."""
    sites = []
    if _status(m.weight_headroom_bits) != "ok":
        sites.append(("weights", m.weight_headroom_bits))
    out = _status(m.output_headroom_bits)
    if out != "ok" and _RANK[out] > _RANK[_status(target.headroom_bits(m.input_max))]:
        sites.append(("outputs", m.output_headroom_bits))
    return [(site, head) for site, head in sites if head is not None]


def block_paths(model: nn.Module, blocks: Iterable[nn.Module] = ()) -> list[str]:
    """The fix units' candidates: the task's repeated blocks (by identity) and every `nn.ModuleList` item."""
    names = {id(m): name for name, m in model.named_modules()}
    found = [names[id(b)] for b in blocks if id(b) in names]
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList):
            found += [f"{name}.{child}" if name else child for child, _ in module.named_children()]
    return list(dict.fromkeys(found))


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent + ".")


def _unit_of(path: str, blocks: list[str]) -> str:
    holding = [b for b in blocks if _within(path, b)]
    return max(holding, key=len) if holding else path


def _kept(path: str, patterns: list[str]) -> bool:
    """Inside a --keep-fp32 path (a path, its subtree, or a glob)."""
    return any(_within(path, p) or fnmatch.fnmatchcase(path, p) for p in patterns)


def range_fix(units: list[str], target: RangeTarget = FP16) -> str:
    """The fix for fix units that do not fit `target`, in the words of `diagnostics.advice`: keep them in
    fp32, or (fp16) bf16, which has fp32's exponent range."""
    bf16 = f"use bf16 (--precision bf16-mixed: fp32's exponent range, no overflow at {target.max:g})"
    wider = bf16 if target.format == FP16.format else "nothing narrower than fp32 holds it"
    parts = [u for u in units if u != ROOT]
    if not parts:
        return f"{wider}; the value is made in the model's own forward, outside any submodule"
    return f"keep {', '.join(parts)} in fp32 (--keep-fp32 {','.join(parts)}) or {wider}"


def range_lines(audit: RangeAudit, offenders: list[RangeOffender]) -> list[str]:
    """One line of evidence per offender: where the value is born, how large, its headroom."""
    return [
        f"{o.module}: {o.origin}'s {o.site} reach |x| {o.max_abs:.3g} in fp32 over {audit.batches} "
        f"batch{'' if audit.batches == 1 else 'es'}, "
        f"headroom {o.headroom_bits:+.2f} bits to {audit.format}'s max {audit.max:g}"
        + (f" (over: inf in {audit.format})" if o.status == "over" else f" (under {audit.near_bits:g} bit: 1 doubling)")
        for o in offenders
    ]


def find_offenders(
    ranges: list[ModuleRange], blocks: list[str], keep_fp32: list[str], target: RangeTarget = FP16
) -> list[RangeOffender]:
    """The fix units holding an origin (module docstring); smallest headroom first. Each names its
    innermost origin of the worst status (the Linear whose bias makes the value, not the block's sum)."""
    origins: dict[str, list[tuple[ModuleRange, str, float]]] = {}
    for m in ranges:
        for site, head in origin_sites(m, target):
            unit = ROOT if m.name == ROOT else _unit_of(m.name, blocks)
            origins.setdefault(unit, []).append((m, site, head))
    units = [u for u in origins if not any(v != u and (u == ROOT or _within(v, u)) for v in origins)]
    offenders = [_offender(unit, origins[unit], keep_fp32, target) for unit in units]
    return sorted(offenders, key=lambda o: o.headroom_bits)


def _offender(
    unit: str, origins: list[tuple[ModuleRange, str, float]], keep_fp32: list[str], target: RangeTarget
) -> RangeOffender:
    head = min(h for _, _, h in origins)
    worst = _status(head)
    depth = {m.name: (0 if m.name == ROOT else m.name.count(".") + 1) for m, _, _ in origins}
    m, site, _ = max((o for o in origins if _status(o[2]) == worst), key=lambda o: (depth[o[0].name], -o[2]))
    return RangeOffender(
        module=unit,
        origin=m.name,
        site=site,
        max_abs=target.max / 2**head,
        headroom_bits=head,
        status=worst,
        kept_fp32=_kept(unit, keep_fp32) or _kept(m.name, keep_fp32),
        fix=range_fix([unit], target),
    )


def _underflow_notes(ranges: list[ModuleRange], target: RangeTarget) -> list[str]:
    shares = [m for m in ranges if (m.underflow_fraction or 0.0) > UNDERFLOW_NOTE]
    if not shares:
        return []
    m = max(shares, key=lambda r: r.underflow_fraction or 0.0)
    more = f" (and {len(shares) - 1} more modules)" if len(shares) > 1 else ""
    keeps = " (bf16 keeps them)" if target.format == FP16.format else ""
    return [
        f"{m.name}: {100 * (m.underflow_fraction or 0.0):.1f}% of its nonzero outputs are below {target.format}'s "
        f"smallest normal {target.smallest_normal:.2g}{more}: subnormal or zero in {target.format}{keeps}"
    ]


def retarget(m: ModuleRange, target: RangeTarget) -> ModuleRange:
    """`m`'s headrooms and status against another format (its maxima as measured)."""
    out_h, w_h = target.headroom_bits(m.output_max), target.headroom_bits(m.weight_max)
    both = [h for h in (out_h, w_h) if h is not None]
    head = min(both) if both else None
    return replace(m, output_headroom_bits=out_h, weight_headroom_bits=w_h, headroom_bits=head, status=_status(head))


def _fp16_notes(ranges: list[ModuleRange], blocks: list[str], keep_fp32: list[str], target: RangeTarget) -> list[str]:
    """Under a target wider than fp16, the units fp16 would overflow (not those kept in fp32 already):
    why this precision, not fp16."""
    if target.max <= FP16.max:
        return []
    found = find_offenders([retarget(m, FP16) for m in ranges], blocks, keep_fp32, FP16)
    over = [o for o in found if o.status == "over" and not o.kept_fp32]
    return [
        f"{o.module} reaches |x| {o.max_abs:.3g} in fp32, over fp16's max {FP16.max:g}: fine in {target.format}; "
        f"under fp16, {o.fix}"
        for o in over
    ]


def run_range_audit(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    policy,
    loss_fn,
    blocks: Iterable[nn.Module] = (),
    keep_fp32: Iterable[str] = (),
    target: RangeTarget = FP16,
    gradients: bool = True,
) -> RangeAudit:
    """The audit of `model` (fp32 weights; its mode is kept) over `batches` (on its device), each through
    `core.policy_loss` under `policy` (the fp32 one), then (`gradients`) its backward, against `target`
    (`range_target.precision_target`: the diagnosed precision's format and initial loss scale); `blocks`:
    the task's repeated blocks; `keep_fp32`: the --keep-fp32 paths already applied (their offenders are
    marked kept). The model's `.grad` are as they were on return."""
    recorder = RangeRecorder(model, target).attach()
    grads = GradRangeRecorder(model, recorder.names).attach() if gradients else None
    count = 0
    try:
        with torch.set_grad_enabled(grads is not None), policy.run_context():
            for batch in batches:
                loss, _ = policy_loss(policy, loss_fn, model, batch)  # the hooks record the forward
                if grads is not None:
                    grads.backward(policy, loss)
                count += 1
    finally:
        recorder.detach()
        if grads is not None:
            grads.detach()
    ranges = recorder.ranges()
    if grads is not None:
        ranges = with_gradients(ranges, grads.host(), target)
    kept = [path for pattern in keep_fp32 for path in _kept_paths(model, pattern)]
    return audit_of(ranges, batches=count, blocks=block_paths(model, blocks), keep_fp32=kept, target=target)


def _kept_paths(model: nn.Module, pattern: str) -> tuple[str, ...]:
    """The module paths a --keep-fp32 pattern names, as the precision policy resolves it (a path, a glob,
    a VLM's part name); the pattern itself where it names none (the run refuses it before this)."""
    from ampkit.errors import UsageError
    from ampkit.precision.overrides import resolve_pattern

    try:
        return resolve_pattern(model, pattern)
    except UsageError:
        return (pattern,)


def audit_of(
    ranges: list[ModuleRange], *, batches: int, blocks: list[str], keep_fp32: list[str], target: RangeTarget = FP16
) -> RangeAudit:
    """The record of measured `ranges` against `target`: the offenders, the tightest module, the scaled
    gradients that overflow and the notes (underflow, what fp16 would overflow, the target's own)."""
    ranges = [retarget(m, target) for m in ranges]  # headrooms against `target` (as measured: unchanged)
    measured = [m for m in ranges if m.headroom_bits is not None]
    tight = min(measured, key=lambda m: m.headroom_bits or 0.0) if measured else None
    grad_max = largest_grad(ranges)
    return RangeAudit(
        format=target.format,
        max=target.max,
        smallest_normal=target.smallest_normal,
        near_bits=NEAR_BITS,
        batches=batches,
        modules=ranges,
        offenders=find_offenders(ranges, blocks, keep_fp32, target),
        min_headroom_bits=tight.headroom_bits if tight else None,
        tightest=tight.name if tight else None,
        notes=[*_underflow_notes(ranges, target), *_fp16_notes(ranges, blocks, keep_fp32, target)]
        + ([target.note] if target.note else []),
        loss_scale=target.loss_scale,
        grad_max=grad_max,
        fitting_scale=fitting_scale(grad_max, target),
        grad_overflows=grad_overflows(ranges, target),
    )
