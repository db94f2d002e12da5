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

The low-bit formats a training precision multiplies its Linears in (fp8, mxfp8, mxfp4, nvfp4) also
carry what training in them needs: where their matrix units exist (`native`: the device check and its
refusal text, read by `hardware.capabilities`), the shape rule each converted Linear must meet
(`dim_multiple`), and the name of their module converter (`converter`, a class of
`ampkit.precision.convert`: this layer sits below `precision`, so it names the class, never imports it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampkit.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class NativeRule:
    """Where a format's matmuls run on the device's own matrix units: the device check and its refusal text.

    A pure rule over what torch reports (`hardware.capabilities.DeviceFacts`), so every device is
    testable on a CPU; `hardware.capabilities` applies it (this layer knows no device)."""

    cuda: tuple[int, int] | None = None
    """least NVIDIA compute capability (major, minor) with these matrix units; None: none has them"""
    rocm: tuple[str, ...] = ()
    """AMD gfx architecture prefixes whose matrix cores the converter's kernels drive ("gfx94": MI300)"""
    needs: str
    """the requirement in a refusal's words ("fp8 needs <needs>; <this device> has none: use ...")"""

    def on_cuda(self, compute_capability: tuple[int, int]) -> bool:
        return self.cuda is not None and compute_capability >= self.cuda

    def on_rocm(self, arch: str) -> bool:
        return arch.startswith(self.rocm) if self.rocm else False


FP8_NATIVE = NativeRule(
    cuda=(8, 9),
    rocm=("gfx94", "gfx95"),  # MI300 (fnuz float8, gfx940-942) and MI350 (OCP float8, gfx950)
    needs=(
        "an NVIDIA GPU with compute capability >= 8.9 (Ada or Hopper) or an AMD MI300/MI350 (gfx94x/gfx950): "
        "the float8 matmuls torchao's float8 training drives"
    ),
)
BLOCK_SCALED_NATIVE = NativeRule(
    # Blackwell's fifth-generation tensor cores multiply MXFP8/MXFP6/MXFP4 and NVFP4 with their block
    # scales applied in the MMA (NVIDIA Blackwell architecture technical brief); torchao's MX and NVFP4
    # training kernels (CUTLASS, Triton) gate on sm100 (`torchao.utils.is_sm_at_least_100`). Hopper and
    # Ada have fp8 but no block-scaled MMA; AMD's MI350 (gfx950) has MX matrix cores, which torchao's
    # MX training does not drive, so no ROCm arch is listed.
    cuda=(10, 0),
    needs=(
        "an NVIDIA Blackwell GPU (compute capability >= 10.0: B200, GB200), whose tensor cores multiply "
        "block-scaled formats"
    ),
)


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
    """the GPU table's peak-FLOP/s key its matmuls run at (`hardware.gpus.DTYPE_KEYS`: a column of the
    table, or "mxfp8", the fp8 column on cards with block-scaled MMA only; None: none)"""
    aliases: tuple[str, ...] = ()
    native: NativeRule | None = None
    """where its matmuls run in hardware, for the low-bit training formats (None: not a training format
    of its own, or decided by `hardware.capabilities`' own rules: fp32, tf32, bf16, fp16)"""
    dim_multiple: int = 1
    """the shape rule of a converted Linear: in and out features multiples of this (fp8's kernels need
    16-aligned dims; MX blocks run along both dims of a weight, 32 each; NVFP4's 16)"""
    converter: str = ""
    """the class name of its module converter in `ampkit.precision.convert` ("": no converter)"""
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
            native=FP8_NATIVE,
            dim_multiple=16,
            converter="Float8Converter",
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
            peak_key="mxfp8",
            native=BLOCK_SCALED_NATIVE,
            dim_multiple=32,
            converter="MXFP8Converter",
            about="OCP MXFP8: e4m3 elements, one E8M0 power-of-two scale per 32",
        ),
        NumericFormat(
            name="mxfp4",
            dtype=None,
            bits=4,
            block=32,
            scale_bits=_E8M0_PER_32,
            peak_key="fp4",
            native=BLOCK_SCALED_NATIVE,
            dim_multiple=32,
            converter="MXFP4Converter",
            about="OCP MXFP4: e2m1 elements (packed two a byte), one E8M0 scale per 32",
        ),
        NumericFormat(
            name="nvfp4",
            dtype=None,
            bits=4,
            block=16,
            scale_bits=8 / 16,
            peak_key="fp4",
            native=BLOCK_SCALED_NATIVE,
            dim_multiple=16,
            converter="NVFP4Converter",
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
