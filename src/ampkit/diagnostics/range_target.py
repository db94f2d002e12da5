"""The range the audit checks against: the diagnosed precision's format, read from `ampkit.formats`.

A precision's unscaled values (activations, weights cast by autocast, activation gradients) live in
its compute dtype: fp16 for fp16-mixed and fp16-true (largest 65504, smallest normal 2^-14 = 6.1e-5),
bf16 for bf16-mixed, bf16-true and the low-bit recipes' autocast around their converted Linears
(fp32's exponent: largest ~3.4e38), fp32 for fp32 and tf32 (nothing in a finite fp32 model to flag).

The low-bit formats (fp8 e4m3: largest 448; MXFP8, NVFP4, MXFP4) are not the ceiling of the values
that reach them: ampkit's fp8 recipe scales each tensor so its largest |x| maps to 448 (torchao's
tensorwise and rowwise recipes), and the block-scaled formats scale every 16 or 32 elements, so a
value no format can hold never arises there; what they lose is resolution (a value far below its
tensor's or block's max), the what-if ledger's measure (`doctor --what-if`), not overflow. Their
precisions are audited against the bf16 around them, with a note saying so.

The backward's ceiling is the same format times the loss scale: under fp16-mixed the scaler multiplies
the loss by its init scale (65536 unless --init-scale), so a true-scale |gradient| g is held as
g x 65536, inf above 65504 / 65536 = 0.9995 (`diagnostics.range_grads`); without a scaler the scale is 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ampkit.formats import get_format, name_of
from ampkit.precision import get_spec

NEAR_BITS = 1.0
"""Headroom (bits) below which a module is flagged "near": one doubling from the format's max."""


@dataclass(frozen=True, kw_only=True)
class RangeTarget:
    """A format's range, as the audit compares magnitudes with it (units: the model's own)."""

    format: str
    """the `ampkit.formats` name ("fp16", "bf16", "fp32")"""
    max: float
    """largest finite magnitude"""
    smallest_normal: float
    smallest_subnormal: float
    """smallest positive magnitude (fp16: 2^-24 = 5.96e-8); below half of it a value rounds to 0"""
    loss_scale: float = 1.0
    """the factor the backward's gradients carry: the diagnosed precision's initial loss scale, 1 without one"""
    note: str = ""
    """why the format is not the one the precision's name suggests (a low-bit recipe's scaled Linears)"""

    @property
    def unbounded(self) -> bool:
        """fp32 itself (tf32 too: fp32's range): a finite fp32 value always fits, so nothing is flagged."""
        return get_format(self.format).dtype is torch.float32

    def headroom_bits(self, max_abs: float | None) -> float | None:
        """log2(max / max_abs): doublings left before overflow (< 0: already over); None when nothing
        nonzero was seen (no value to overflow)."""
        if max_abs is None or max_abs <= 0:
            return None
        return math.log2(self.max / max_abs)

    def status(self, headroom: float | None) -> str:
        return status_of(headroom)


def status_of(headroom: float | None) -> str:
    """ "over" (headroom < 0 bits), "near" (< NEAR_BITS) or "ok" (fits, or nothing seen)."""
    if headroom is None or headroom >= NEAR_BITS:
        return "ok"
    return "over" if headroom < 0 else "near"


def format_target(name: str, *, loss_scale: float = 1.0, note: str = "") -> RangeTarget:
    """The range of format `name` (fp16: 65504, 2^-14, 2^-24), from the format registry."""
    info = get_format(name).finfo
    if info is None:
        raise ValueError(f"{name} is not a floating-point format with a range")
    return RangeTarget(
        format=get_format(name).name,
        max=float(info.max),
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_normal * info.eps),  # 2^(min exponent) x 2^-(mantissa bits)
        loss_scale=loss_scale,
        note=note,
    )


FP16 = format_target("fp16")
"""fp16's range: the audit's default target, and the one its notes compare wider targets with."""


def precision_target(precision: str, *, loss_scale: float | None = None) -> RangeTarget:
    """The target of `precision`: its compute dtype's format; `loss_scale`: the scale its backward
    starts at (the policy's `loss_scale()` before any step: None or 1 without a scaler)."""
    spec = get_spec(precision)
    name = name_of(spec.compute_dtype) or "fp32"
    note = ""
    if spec.converts_linears:
        fmt = spec.linear_format
        note = (
            f"{spec.name}'s Linears multiply in {fmt.name}, scaled per tensor or block before the cast, so its "
            f"max is no ceiling there; the rest runs in {name}, audited here"
        )
    return format_target(name, loss_scale=float(loss_scale or 1.0), note=note)
