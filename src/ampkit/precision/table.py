"""The one precision vocabulary: every name maps once to its dtypes and behaviour.

Every fact another module needs about a precision is a field or a property of `PrecisionSpec`, so no
module outside `ampkit.precision` re-derives one from the name (`name == "fp32"`, `"-true" in name`):
adding a precision is one entry in `SPECS`, and every command (bench, train, doctor, plan) follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampkit.errors import UsageError
from ampkit.formats import NumericFormat, get_format, short_name


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
    linears: str
    """the numeric format (`ampkit.formats`) its Linear layers multiply in: the compute dtype's, "tf32",
    or a low-bit one ("fp8-e4m3", "mxfp8", "mxfp4", "nvfp4") whose converter (`ampkit.precision.convert`,
    named by the format) swaps the eligible Linears"""
    emulated: bool = False
    """the low-bit matmuls are rounded in software (quantize, then dequantize) and multiplied in a wider
    dtype, on every device: it measures the format's fidelity, not its speed (fp8-emulated, mxfp8-emulated...)"""
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
        GPU peak-FLOP tables (MFU, plan's compute time) and the argument of `DeviceInfo.is_native`;
        "mxfp8" and "fp4" for the block-scaled formats (`hardware.DTYPE_KEYS`). An emulated format rounds
        in software and multiplies in a wider dtype, so it runs at its compute dtype's (bf16's) peak."""
        if self.emulated:
            return short_name(self.compute_dtype)
        return self.linear_format.peak_key or self.linear_format.key

    @property
    def compute_dtype_key(self) -> str:
        """The dtype key ("fp32", "bf16", "fp16") of `compute_dtype` itself (tf32 and fp8 compute in
        fp32 and bf16): what a LoRA base stored at the compute dtype is kept in."""
        return short_name(self.compute_dtype)  # hardware.DTYPE_KEYS: the GPU table's columns

    @property
    def low_precision_key(self) -> str | None:
        """The 16-bit dtype key ("bf16" or "fp16") it computes in, whose native support the device
        check demands (refused on CUDA without it, warned about on CPU); None for fp32 and tf32.
        fp8 runs bf16 autocast around its float8 Linears, so it needs bf16 too."""
        key = self.compute_dtype_key
        return None if key == "fp32" else key

    @property
    def low_precision_weights(self) -> bool:
        """Weights, gradients and optimizer states live in a 16-bit dtype (the "-true" regimes), not fp32."""
        return self.param_dtype != torch.float32

    @property
    def linear_format(self) -> NumericFormat:
        return get_format(self.linears)

    @property
    def converts_linears(self) -> bool:
        """Its Linear layers are swapped for low-bit ones (a format narrower than 16 bits: fp8, and the
        microscaling formats to come); the rest of the model runs autocast in `compute_dtype`."""
        return self.linear_format.bits < 16

    @property
    def native_low_bit(self) -> bool:
        """Low-bit Linears on the hardware's own matrix units (needs the device to have them)."""
        return self.converts_linears and not self.emulated

    @property
    def emulated_twin(self) -> str | None:
        """The emulated precision of the same format ("mxfp8" -> "mxfp8-emulated"; itself when emulated):
        what a refusal offers where the device lacks the matrix units, and what plan traces on a CPU."""
        if not self.converts_linears:
            return None
        return next(s.name for s in SPECS.values() if s.linears == self.linears and s.emulated)


_f32, _bf16, _f16 = torch.float32, torch.bfloat16, torch.float16


def _spec(
    name: str,
    simplicity: int,
    param_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    summary: str,
    *,
    loss_scaling: bool = False,
    tf32: bool = False,
    linears: str = "",
    emulated: bool = False,
    is_reference: bool = False,
) -> PrecisionSpec:
    """One row of `SPECS`. Autocast is what makes a regime mixed: fp32 weights computing in a 16-bit dtype."""
    mixed = param_dtype == torch.float32 and compute_dtype != torch.float32
    return PrecisionSpec(
        name=name,
        simplicity=simplicity,
        is_reference=is_reference,
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
        autocast=mixed,
        loss_scaling=loss_scaling,
        tf32=tf32,
        linears=linears or ("tf32" if tf32 else short_name(compute_dtype)),
        emulated=emulated,
        summary=summary,
    )


def _low_bit(fmt: str, simplicity: int, summary: str) -> tuple[PrecisionSpec, PrecisionSpec]:
    """A block-scaled format's two rows: native, then its emulation (fp32 weights, bf16 autocast around)."""
    return (
        _spec(fmt, simplicity, _f32, _bf16, summary, linears=fmt),
        _spec(
            f"{fmt}-emulated",
            simplicity + 1,
            _f32,
            _bf16,
            f"{fmt} rounded in software on any device: its fidelity, not its speed",
            linears=fmt,
            emulated=True,
        ),
    )


# Table order is the order of help texts and of `plan`'s columns. `simplicity` orders by what can go
# wrong: fp32; tf32 (one backend flag); bf16-mixed (autocast, no scaler); fp16-mixed (plus a loss
# scaler); the -true regimes (16-bit master weights and optimizer states cost fidelity, fp16's range
# more so); the low-bit formats last (their converters swap the Linear layers), each emulation after
# its native form (no speedup to pay for it): fp8, then the block-scaled MXFP8, NVFP4 and MXFP4 (4-bit
# elements cost the most fidelity; MXFP4's power-of-two scales over 32 elements more than NVFP4's e4m3 over 16).
# Columns: name, simplicity, param dtype, compute dtype, summary; then what differs from the defaults.
_TABLE = (
    _spec("fp32", 0, _f32, _f32, "the reference: fp32 everywhere, TF32 off", is_reference=True),
    _spec("tf32", 1, _f32, _f32, "fp32 weights, TF32 tensor-core matmuls (CUDA Ampere+)", tf32=True),
    _spec("fp16-mixed", 3, _f32, _f16, "fp32 weights, fp16 autocast, dynamic loss scaling", loss_scaling=True),
    _spec("bf16-mixed", 2, _f32, _bf16, "fp32 weights, bf16 autocast (default on Ampere+)"),
    _spec("bf16-true", 4, _bf16, _bf16, "bf16 weights and compute: memory-lean, costs fidelity"),
    _spec("fp16-true", 5, _f16, _f16, "model.half(): kept to show why it fails"),
    _spec("fp8", 6, _f32, _bf16, "float8 Linear matmuls (torchao), bf16 elsewhere; CUDA sm89+", linears="fp8-e4m3"),
    _spec(
        "fp8-emulated",
        7,
        _f32,
        _bf16,
        "fp8 with software emulation: tests the path, no speedup",
        linears="fp8-e4m3",
        emulated=True,
    ),
    *_low_bit("mxfp8", 8, "MXFP8 Linear matmuls (torchao), bf16 elsewhere; Blackwell sm100"),
    *_low_bit("nvfp4", 10, "NVFP4 Linear matmuls (torchao), bf16 elsewhere; Blackwell sm100"),
    *_low_bit("mxfp4", 12, "MXFP4 Linear matmuls, bf16 elsewhere; no training kernels yet"),
)
SPECS: dict[str, PrecisionSpec] = {s.name: s for s in _TABLE}

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
