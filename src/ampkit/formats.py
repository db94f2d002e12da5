"""Numeric formats, written once: each format's torch dtype, bits, block scale, range and its GPU-table
column. Every other module reads a format's dtype or bytes from here (tests/test_formats.py greps for
maps written elsewhere).

A *format* is how one number is stored or multiplied (fp32, bf16, fp8 e4m3, MXFP8's 32-element blocks
of e4m3 under one power-of-two scale, ...); a *precision* (`ampkit.precision`) combines formats: weights
in one, matmuls in another, a loss scale or not. Integer storage for token ids (uint16/uint32 shards)
is not a numeric format in this sense.

Block-scaled formats store a scale per `block` elements: MXFP8 and MXFP4 one E8M0 (8-bit power of two)
per 32 elements (the OCP Microscaling spec), NVFP4 one e4m3 per 16 elements plus one fp32 per tensor
(NVIDIA), nf4 (bitsandbytes) one 8-bit absmax per 64 weights quantised again per 256 blocks under one
fp32 scale. `bytes_per_element` counts the element and its share of the scales; a per-tensor scale
(a few bytes a tensor) is not counted. Units: bits, bytes per element.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampkit.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class NumericFormat:
    name: str
    """the name flags and tables use ("fp32", "bf16", "fp8-e4m3", "mxfp8", ...)"""
    dtype: torch.dtype | None
    """the torch dtype of one element (None: 4-bit codes packed two to a byte, no element dtype)"""
    bits: int
    """bits of one element"""
    block: int = 1
    """elements sharing one scale (1: no block scale)"""
    scale_bits: float = 0.0
    """bits of block scale per element (the scale's bits over `block`, nested scales included)"""
    peak_key: str | None = None
    """the GPU table's peak-FLOP/s column its matmuls run at (`hardware.gpus.PEAK_KEYS`; None: none)"""
    aliases: tuple[str, ...] = ()
    short: str = ""
    """the key it goes by in ampkit's tables where that is not its name (fp8's two layouts: "fp8")"""
    about: str = ""

    @property
    def key(self) -> str:
        """The key it goes by in ampkit's tables (`hardware.DTYPE_KEYS`: "fp32", "bf16", "fp8", ...)."""
        return self.short or self.name

    @property
    def bytes_per_element(self) -> float:
        """Bytes of one element with its share of the block scales."""
        return (self.bits + self.scale_bits) / 8

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of its torch dtype (the dtype's itemsize); formats without a dtype refuse."""
        if self.dtype is None:
            raise ValueError(f"{self.name} packs {self.bits}-bit codes: no torch dtype to size one element by")
        return self.dtype.itemsize

    @property
    def finfo(self) -> torch.finfo | None:
        """Range and resolution of a floating-point element (None for integer and packed codes)."""
        return torch.finfo(self.dtype) if self.dtype is not None and self.dtype.is_floating_point else None


_E8M0_PER_32 = 8 / 32
FORMATS: dict[str, NumericFormat] = {
    f.name: f
    for f in (
        NumericFormat(
            name="fp32",
            dtype=torch.float32,
            bits=32,
            peak_key="fp32",
            about="IEEE single: 8 exponent, 23 mantissa bits",
        ),
        NumericFormat(
            name="tf32",
            dtype=torch.float32,
            bits=32,
            peak_key="tf32",
            about="fp32 storage; matmuls round inputs to 10 mantissa bits on tensor cores (a math mode)",
        ),
        NumericFormat(
            name="bf16",
            dtype=torch.bfloat16,
            bits=16,
            peak_key="bf16",
            about="bfloat16: fp32's 8 exponent bits, 7 mantissa bits",
        ),
        NumericFormat(
            name="fp16",
            dtype=torch.float16,
            bits=16,
            peak_key="fp16",
            about="IEEE half: 5 exponent, 10 mantissa bits; largest 65504",
        ),
        NumericFormat(
            name="fp8-e4m3",
            dtype=torch.float8_e4m3fn,
            bits=8,
            peak_key="fp8",
            aliases=("fp8", "e4m3"),
            short="fp8",
            about="float8 e4m3fn: 4 exponent, 3 mantissa bits, largest 448 (weights and activations)",
        ),
        NumericFormat(
            name="fp8-e5m2",
            dtype=torch.float8_e5m2,
            bits=8,
            peak_key="fp8",
            aliases=("e5m2",),
            short="fp8",
            about="float8 e5m2: 5 exponent, 2 mantissa bits, largest 57344 (gradients)",
        ),
        NumericFormat(
            name="mxfp8",
            dtype=torch.float8_e4m3fn,
            bits=8,
            block=32,
            scale_bits=_E8M0_PER_32,
            peak_key="fp8",
            about="OCP MXFP8: e4m3 elements, one E8M0 power-of-two scale per 32",
        ),
        NumericFormat(
            name="mxfp4",
            dtype=None,
            bits=4,
            block=32,
            scale_bits=_E8M0_PER_32,
            peak_key="fp4",
            about="OCP MXFP4: e2m1 elements (packed two a byte), one E8M0 scale per 32",
        ),
        NumericFormat(
            name="nvfp4",
            dtype=None,
            bits=4,
            block=16,
            scale_bits=8 / 16,
            peak_key="fp4",
            about="NVIDIA NVFP4: e2m1 elements, one e4m3 scale per 16 and one fp32 per tensor",
        ),
        NumericFormat(name="int8", dtype=torch.int8, bits=8, about="8-bit integers (bitsandbytes' 8-bit states)"),
        NumericFormat(
            name="nf4",
            dtype=None,
            bits=4,
            block=64,
            scale_bits=8 / 64 + 32 / (64 * 256),
            about="bitsandbytes NormalFloat4: 16 normal quantiles, an 8-bit absmax per 64 (fp32 per 256 of those)",
        ),
    )
}
_BY_ALIAS = {alias: f for f in FORMATS.values() for alias in (f.name, *f.aliases)}


def get_format(name: str, *, flag: str = "") -> NumericFormat:
    """The format named `name` (or an alias: "fp8" is e4m3); an unknown name is refused in one line
    naming `flag` when given."""
    found = _BY_ALIAS.get(name.strip().lower())
    if found is None:
        where = f" for {flag}" if flag else ""
        raise UsageError(f"unknown numeric format {name!r}{where}; known: {', '.join(FORMATS)}")
    return found


def dtype_of(name: str, *, flag: str = "") -> torch.dtype:
    """The torch dtype of format `name`'s elements (packed 4-bit formats have none: refused)."""
    fmt = get_format(name, flag=flag)
    if fmt.dtype is None:
        raise UsageError(f"{fmt.name} has no torch element dtype ({fmt.about})")
    return fmt.dtype


def name_of(dtype: torch.dtype) -> str | None:
    """The plain format a torch dtype stores ("fp32", "bf16", "fp16", "fp8-e4m3", ...; None: none)."""
    for fmt in FORMATS.values():
        if fmt.dtype == dtype and fmt.block == 1:
            return fmt.name
    return None


def short_name(dtype: torch.dtype) -> str:
    """The key a dtype goes by in ampkit's tables ("fp32", "bf16", "fp16", "fp8"; else torch's name)."""
    name = name_of(dtype)
    return get_format(name).key if name is not None else str(dtype).removeprefix("torch.")


def choices(names: tuple[str, ...]) -> dict[str, NumericFormat]:
    """`names` (a flag's choices) with their formats, in that order."""
    return {name: get_format(name) for name in names}
