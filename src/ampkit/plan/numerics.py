"""Byte sizes of a precision regime, as the memory ledger sees them.

Every name of DESIGN.md's vocabulary plans. `fp8` is planned analytically as ampkit's torchao recipe
(fp32 weights, bf16 autocast around the model, block Linears swapped for Float8Linear, the output
head left in bf16). Float8Linear saves its *high-precision* input and weight for backward and casts
to float8 inside, so its activations equal bf16-mixed's, minus the bf16 weight copies of the block
Linears (the float8 weight cast is transient, one layer at a time). `fp8-emulated` has fp8's memory
and bf16's speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampkit.errors import UsageError
from ampkit.precision import SPECS, canonical_name

FP32_BYTES = 4  # norm statistics, RoPE, log-softmax and the loss are fp32 in every regime
# Planned by default ("all"): the vocabulary without its test-only emulated variants, plus fp8
# even where the precision table does not list it yet.
PLAN_PRECISIONS = tuple(dict.fromkeys([*(n for n, s in SPECS.items() if getattr(s, "fp8", None) != "emulated"), "fp8"]))


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
    """block Linears run torchao Float8Linear (no saved weight copies)"""
    peak_key: str
    """the GPU peak-FLOP/s column this regime's matmuls run at (hardware.DTYPE_KEYS)"""
    traceable: bool = True
    """the traced engine runs this regime: all but native fp8, which needs an sm89+ GPU to run; its
    memory is fp8-emulated's, which traces on CPU (torchao's emulation)"""


def plan_precision_name(name: str) -> str:
    """Canonical name of a precision or alias, `fp8` included."""
    key = name.strip().lower()
    if key in ("fp8", "float8") and "fp8" not in SPECS:
        return "fp8"
    try:
        return canonical_name(name)
    except UsageError:
        raise UsageError(
            f"unknown precision {name!r}; choose from: {', '.join(PLAN_PRECISIONS)} "
            "(or an alias such as bf16, fp16, 32-true)"
        ) from None


def get_numerics(name: str) -> Numerics:
    name = plan_precision_name(name)
    spec = SPECS.get(name)
    if spec is None:  # fp8 before the precision table lists it: torchao's recipe, fp32 weights
        return Numerics(
            name=name,
            param_bytes=4,
            compute_bytes=2,
            autocast=True,
            float8_block_linears=True,
            peak_key="fp8",
            traceable=False,
        )
    fp8 = getattr(spec, "fp8", None)
    compute = _bytes(spec.compute_dtype)
    if fp8:
        peak_key = "fp8" if fp8 == "native" else "bf16"  # emulation rounds in software: no fp8 speed
    elif compute == 4:
        peak_key = "tf32" if spec.tf32 else "fp32"
    else:
        peak_key = "bf16" if spec.compute_dtype == torch.bfloat16 else "fp16"
    return Numerics(
        name=name,
        param_bytes=_bytes(spec.param_dtype),
        compute_bytes=compute,
        autocast=spec.autocast,
        float8_block_linears=bool(fp8),
        peak_key=peak_key,
        traceable=fp8 in (None, "emulated"),
    )


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


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
