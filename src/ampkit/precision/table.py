"""The one precision vocabulary: every name maps once to its dtypes and behaviour.

Every fact another module needs about a precision is a field or a property of `PrecisionSpec`, so no
module outside `ampkit.precision` re-derives one from the name (`name == "fp32"`, `"-true" in name`):
adding a precision is one entry in `SPECS`, and every command (bench, train, doctor, plan) follows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from ampkit.errors import UsageError


class Fp8Mode(enum.Enum):
    """How an fp8 precision runs its float8 Linear matmuls."""

    NATIVE = "native"
    """float8 tensor cores (CUDA sm89+): the speedup fp8 is for."""
    EMULATED = "emulated"
    """torchao rounds to float8 in software, on any device: exercises the code path, no speedup."""


# The dtype keys of `hardware` (hardware.DTYPE_KEYS: GPU peak-FLOP tables, DeviceInfo.is_native) of
# the torch dtypes a precision computes in; tf32 and fp8 are matmul modes on top of these.
_DTYPE_KEYS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


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
    fp8: Fp8Mode | None = None
    """float8 Linear layers: NATIVE (CUDA sm89+), EMULATED (software, any device), or None (no fp8)."""
    simplicity: int
    """rank that breaks ties in `bench`'s recommendation, simpler first (unique per precision): fewer
    moving parts (no loss scaler, fp32 master weights) and fewer ways to lose fidelity rank lower."""
    is_reference: bool = False
    """the yardstick (fp32 only): bench measures it first and compares every other precision's speed,
    memory and fidelity against it; doctor's smoke and fidelity checks run against it too."""
    summary: str
    """one line for tables and help."""

    @property
    def matmul_key(self) -> str:
        """The dtype key ("fp32", "tf32", "bf16", "fp16", "fp8") its matmuls run at: the column of the
        GPU peak-FLOP tables (MFU, plan's compute time) and the argument of `DeviceInfo.is_native`.
        Emulated fp8 rounds in software and multiplies in bf16, so it runs at bf16's peak."""
        if self.tf32:
            return "tf32"
        if self.fp8 is Fp8Mode.NATIVE:
            return "fp8"
        return _DTYPE_KEYS[self.compute_dtype]

    @property
    def low_precision_key(self) -> str | None:
        """The 16-bit dtype key ("bf16" or "fp16") it computes in, whose native support the device
        check demands (refused on CUDA without it, warned about on CPU); None for fp32 and tf32.
        fp8 runs bf16 autocast around its float8 Linears, so it needs bf16 too."""
        key = _DTYPE_KEYS[self.compute_dtype]
        return None if key == "fp32" else key

    @property
    def low_precision_weights(self) -> bool:
        """Weights, gradients and optimizer states live in a 16-bit dtype (the "-true" regimes), not fp32."""
        return self.param_dtype != torch.float32

    @property
    def emulated(self) -> bool:
        """Runs by software emulation on every device: a test path with no speedup (fp8-emulated)."""
        return self.fp8 is Fp8Mode.EMULATED


_f32, _bf16, _f16 = torch.float32, torch.bfloat16, torch.float16

# Table order is the order of help texts and of `plan`'s columns. `simplicity` orders by what can go
# wrong: fp32; tf32 (one backend flag); bf16-mixed (autocast, no scaler); fp16-mixed (plus a loss
# scaler); the -true regimes (16-bit master weights and optimizer states cost fidelity, fp16's range
# more so); fp8 last (torchao swaps the Linear layers), its emulation after it (no speedup to pay for it).
SPECS: dict[str, PrecisionSpec] = {
    s.name: s
    for s in (
        PrecisionSpec(
            name="fp32",
            simplicity=0,
            is_reference=True,
            param_dtype=_f32,
            compute_dtype=_f32,
            autocast=False,
            loss_scaling=False,
            tf32=False,
            summary="the reference: fp32 everywhere, TF32 off",
        ),
        PrecisionSpec(
            name="tf32",
            simplicity=1,
            param_dtype=_f32,
            compute_dtype=_f32,
            autocast=False,
            loss_scaling=False,
            tf32=True,
            summary="fp32 weights, TF32 tensor-core matmuls (CUDA Ampere+)",
        ),
        PrecisionSpec(
            name="fp16-mixed",
            simplicity=3,
            param_dtype=_f32,
            compute_dtype=_f16,
            autocast=True,
            loss_scaling=True,
            tf32=False,
            summary="fp32 weights, fp16 autocast, dynamic loss scaling",
        ),
        PrecisionSpec(
            name="bf16-mixed",
            simplicity=2,
            param_dtype=_f32,
            compute_dtype=_bf16,
            autocast=True,
            loss_scaling=False,
            tf32=False,
            summary="fp32 weights, bf16 autocast (default on Ampere+)",
        ),
        PrecisionSpec(
            name="bf16-true",
            simplicity=4,
            param_dtype=_bf16,
            compute_dtype=_bf16,
            autocast=False,
            loss_scaling=False,
            tf32=False,
            summary="bf16 weights and compute: memory-lean, costs fidelity",
        ),
        PrecisionSpec(
            name="fp16-true",
            simplicity=5,
            param_dtype=_f16,
            compute_dtype=_f16,
            autocast=False,
            loss_scaling=False,
            tf32=False,
            summary="model.half(): kept to show why it fails",
        ),
        PrecisionSpec(
            name="fp8",
            simplicity=6,
            param_dtype=_f32,
            compute_dtype=_bf16,
            autocast=True,
            loss_scaling=False,
            tf32=False,
            fp8=Fp8Mode.NATIVE,
            summary="float8 Linear matmuls (torchao), bf16 elsewhere; CUDA sm89+",
        ),
        PrecisionSpec(
            name="fp8-emulated",
            simplicity=7,
            param_dtype=_f32,
            compute_dtype=_bf16,
            autocast=True,
            loss_scaling=False,
            tf32=False,
            fp8=Fp8Mode.EMULATED,
            summary="fp8 with software emulation: tests the path, no speedup",
        ),
    )
}

REFERENCE: str = next(s.name for s in SPECS.values() if s.is_reference)
"""The reference precision's name (fp32)."""

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


def precision_names_help(*, include_emulated: bool = True) -> str:
    """The canonical precision names for help texts, in table order: "fp32, tf32, ..."."""
    return ", ".join(s.name for s in SPECS.values() if include_emulated or not s.emulated)
