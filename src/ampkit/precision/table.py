"""The one precision vocabulary: every name maps once to its dtypes and behaviour."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampkit.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class PrecisionSpec:
    """What a precision regime means, independent of the device."""

    name: str
    param_dtype: torch.dtype
    """dtype the weights (and so optimizer states) are stored in."""
    compute_dtype: torch.dtype
    """dtype of matmul outputs inside the forward context."""
    autocast: bool
    """whether forward runs under torch.autocast(compute_dtype)."""
    loss_scaling: bool
    """whether a dynamic GradScaler guards the backward pass."""
    tf32: bool
    """whether TF32 tensor-core matmuls (cuBLAS and cuDNN) are allowed."""
    fp8: str | None = None
    """float8 Linear layers: "native" (CUDA sm89+), "emulated" (software, any device), or None."""
    summary: str
    """one line for tables and help."""


_f32, _bf16, _f16 = torch.float32, torch.bfloat16, torch.float16

SPECS: dict[str, PrecisionSpec] = {
    s.name: s
    for s in (
        PrecisionSpec(
            name="fp32",
            param_dtype=_f32,
            compute_dtype=_f32,
            autocast=False,
            loss_scaling=False,
            tf32=False,
            summary="the reference: fp32 everywhere, TF32 off",
        ),
        PrecisionSpec(
            name="tf32",
            param_dtype=_f32,
            compute_dtype=_f32,
            autocast=False,
            loss_scaling=False,
            tf32=True,
            summary="fp32 weights, TF32 tensor-core matmuls (CUDA Ampere+)",
        ),
        PrecisionSpec(
            name="fp16-mixed",
            param_dtype=_f32,
            compute_dtype=_f16,
            autocast=True,
            loss_scaling=True,
            tf32=False,
            summary="fp32 weights, fp16 autocast, dynamic loss scaling",
        ),
        PrecisionSpec(
            name="bf16-mixed",
            param_dtype=_f32,
            compute_dtype=_bf16,
            autocast=True,
            loss_scaling=False,
            tf32=False,
            summary="fp32 weights, bf16 autocast (default on Ampere+)",
        ),
        PrecisionSpec(
            name="bf16-true",
            param_dtype=_bf16,
            compute_dtype=_bf16,
            autocast=False,
            loss_scaling=False,
            tf32=False,
            summary="bf16 weights and compute: memory-lean, costs fidelity",
        ),
        PrecisionSpec(
            name="fp16-true",
            param_dtype=_f16,
            compute_dtype=_f16,
            autocast=False,
            loss_scaling=False,
            tf32=False,
            summary="model.half(): kept to show why it fails",
        ),
        PrecisionSpec(
            name="fp8",
            param_dtype=_f32,
            compute_dtype=_bf16,
            autocast=True,
            loss_scaling=False,
            tf32=False,
            fp8="native",
            summary="float8 Linear matmuls (torchao), bf16 elsewhere; CUDA sm89+",
        ),
        PrecisionSpec(
            name="fp8-emulated",
            param_dtype=_f32,
            compute_dtype=_bf16,
            autocast=True,
            loss_scaling=False,
            tf32=False,
            fp8="emulated",
            summary="fp8 with software emulation: tests the path, no speedup",
        ),
    )
}

ALIASES: dict[str, str] = {
    "32": "fp32",
    "32-true": "fp32",
    "fp32-true": "fp32",
    "float32": "fp32",
    "no": "fp32",
    "16-mixed": "fp16-mixed",
    "fp16": "fp16-mixed",
    "16": "fp16-mixed",
    "amp": "fp16-mixed",
    "bf16": "bf16-mixed",
    "bf16-mixed": "bf16-mixed",
    "bfloat16": "bf16-mixed",
    "16-true": "fp16-true",
    "half": "fp16-true",
    "float8": "fp8",
    "fp8-mixed": "fp8",
    "transformer-engine": "fp8",
}


def canonical_name(name: str) -> str:
    """Map a precision name or ecosystem alias to its canonical name; refuse unknown ones."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in SPECS:
        known = ", ".join(SPECS)
        raise UsageError(f"unknown precision '{name}'; choose one of: {known} (aliases: {', '.join(ALIASES)})")
    return key


def get_spec(name: str) -> PrecisionSpec:
    return SPECS[canonical_name(name)]
