"""Byte sizes of a precision regime, as the memory ledger sees them.

Every name of `ampkit.precision.SPECS` plans. `fp8` is planned analytically as ampkit's torchao recipe
(fp32 weights, bf16 autocast around the model, block Linears swapped for Float8Linear, the output
head left in bf16). Float8Linear saves its *high-precision* input and weight for backward and casts
to float8 inside, so its activations equal bf16-mixed's, minus the bf16 weight copies of the block
Linears (the float8 weight cast is transient, one layer at a time). `fp8-emulated` has fp8's memory
and bf16's speed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ampkit.errors import UsageError
from ampkit.formats import get_format, name_of
from ampkit.precision import SPECS, canonical_name

FP32_BYTES = 4  # norm statistics, RoPE, log-softmax and the loss are fp32 in every regime
# Planned by default ("all"): the vocabulary without its test-only emulated variants.
PLAN_PRECISIONS = tuple(n for n, s in SPECS.items() if not s.emulated)


@dataclass(frozen=True, kw_only=True)
class Numerics:
    """How one precision regime stores and computes, in bytes per element."""

    name: str
    param_bytes: int
    """weights, their gradients and the residual stream (fp32 under mixed precision)"""
    compute_bytes: int
    """matmul outputs and the activations saved around them"""
    autocast: bool
    """matmul inputs are cast per call (each Linear saves its own low-precision copy of its input,
    and autocast caches a low-precision copy of each weight)"""
    float8_block_linears: bool = False
    """block Linears run a low-bit converter's Linears (torchao's Float8Linear, ampkit's MX/NVFP4 ones), which
    save their high-precision inputs: no autocast weight copies (the analytic ledger plans every low-bit
    format with fp8's memory; the traced engine traces each format's own emulation)"""
    linears: str = ""
    """the numeric format the block Linears multiply in (`PrecisionSpec.linears`)"""
    peak_key: str
    """the GPU peak-FLOP/s column this regime's matmuls run at (hardware.DTYPE_KEYS; `PrecisionSpec.matmul_key`)"""
    traceable: bool = True
    """the traced engine runs this regime: all but native fp8, which needs an sm89+ GPU to run; its
    memory is fp8-emulated's, which traces on CPU (torchao's emulation)"""


def plan_precision_name(name: str) -> str:
    """Canonical name of a precision or alias."""
    try:
        return canonical_name(name)
    except UsageError:
        raise UsageError(
            f"unknown precision {name!r}; choose from: {', '.join(PLAN_PRECISIONS)} "
            "(or an alias such as bf16, fp16, 32-true)"
        ) from None


@functools.cache
def get_numerics(name: str) -> Numerics:
    spec = SPECS[plan_precision_name(name)]
    return Numerics(
        name=spec.name,
        param_bytes=_bytes(spec.param_dtype),
        compute_bytes=_bytes(spec.compute_dtype),
        autocast=spec.autocast,
        float8_block_linears=spec.converts_linears,
        linears=spec.linears,
        peak_key=spec.matmul_key,
        traceable=not spec.native_low_bit,
    )


def _bytes(dtype: torch.dtype) -> int:
    """Bytes of one element of `dtype`, as the format registry states them."""
    name = name_of(dtype)
    if name is None:
        raise ValueError(f"{dtype} is no numeric format of ampkit.formats")
    return get_format(name).element_bytes


def parse_precisions(text: str) -> list[str]:
    """`all`, or a comma-separated list of names/aliases -> canonical names (order kept, no repeats)."""
    if text.strip().lower() == "all":
        return list(PLAN_PRECISIONS)
    names: list[str] = []
    for part in text.split(","):
        if not part.strip():
            raise UsageError(f"empty precision in {text!r}; pass e.g. --precisions fp32,bf16-mixed or 'all'")
        name = plan_precision_name(part)
        if name not in names:
            names.append(name)
    return names
