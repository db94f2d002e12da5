"""Does a numeric format pay on a GEMM? One Linear's training GEMMs on a GPU's roofline, bf16 vs any format.

A Linear of in_features K and out_features N fed M tokens runs three GEMMs per training step, each
2*M*K*N FLOPs:
    forward  Y  = X W^T    (M x K) @ (K x N)   contracts K
    dgrad    dX = dY W     (M x N) @ (N x K)   contracts N
    wgrad    dW = dY^T X   (N x M) @ (M x K)   contracts M
Each takes max(FLOPs / peak, bytes moved / bandwidth) (a roofline: compute- or memory-bound), where
the peak is the GPU table's column the format's matmuls run at (`NumericFormat.peak_key`) and the
operands move in the format's bytes per element, block scales included (`bytes_per_element`); the
output is written in bf16 (fp32 for fp32/tf32 GEMMs).

A low-bit format also pays, every step, for quantizing its operands: memory-bound kernels that read
each operand in bf16 (2 bytes an element) and write it in the format (its element and its share of
the block scales), once per layout the GEMMs need it in (`Quantization`); a scale found in a pass of
its own (an amax over the tensor or the row) reads the operand once more. Bytes an element, with
X = M*K, W = K*N, dY = M*N elements:
    fp8 tensorwise      X, W, dY cast once each: amax read 2 + read 2 + write 1 = 5 bytes (torchao's
                        default recipe: one scale per tensor serves both layouts)
    fp8 rowwise         each cast twice (one row scale per GEMM axis): 2 x 5 = 10 bytes
    fp8 rowwise_with_gw_hp  X once, W twice (axiswise for forward, tensorwise for dgrad), dY once,
                        and dW in bf16 (torchao's Float8LinearConfig recipe of that name)
    MXFP8 / MXFP4       each operand twice, blocks of 32 along each GEMM's contraction axis (torchao's
                        dim0 and dim1 cast kernels), the block's amax found in registers (no extra pass):
                        2 x (2 + 1 + 1/32) = 6.06 bytes (MXFP8), 2 x (2 + 0.53) = 5.06 bytes (MXFP4)
    NVFP4               one global amax pass per operand (the fp32 per-tensor scale), then twice
                        (blocks of 16 along each axis): 2 + 2 x (2 + 0.5625) = 7.1 bytes; its random
                        Hadamard transform on wgrad's inputs is taken as fused into that cast (a 16x16
                        transform is ~16 FMAs an element: memory-bound still)
"Kernel-only" is the GEMMs alone (inputs already in the format: Transformer Engine's "pre-quantized"
mode); "with overhead" adds the quantize kernels (its "autocast" mode).

Assumptions (docs/plan.md): every kernel runs at the table's dense peak or bandwidth (real GEMMs reach
60-80% of it, small ones less; a ratio of two such times cancels a shared efficiency, not a
shape-dependent one); quantize kernels are not fused into the ops before them (torch.compile can fuse
some); launch overheads are ignored. Block-scaled formats run only where the GPU multiplies them
natively (NVIDIA sm100: `block_scaled_mma`). Units: FLOPs, bytes, seconds; peaks in FLOP/s, bandwidth
in bytes/s (the table's GB/s x 1e9).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ampkit.formats import FORMATS, NumericFormat, get_format

if TYPE_CHECKING:
    from ampkit.hardware.gpus import GpuSpec

BASELINE = "bf16"
"""The format every speedup is over."""
HP_BYTES = get_format(BASELINE).bytes_per_element
"""bf16's 2 bytes an element: what every quantize kernel reads and what low-precision GEMMs write."""
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
"""torchao's Float8LinearConfig recipe names."""


@dataclass(frozen=True, kw_only=True)
class Quantization:
    """How a recipe quantizes one Linear's operands (X, W, dY) each step, in memory-bound kernels."""

    name: str
    casts: tuple[int, int, int] = (0, 0, 0)
    """quantize kernels per step for X, W, dY: one per layout the GEMMs read the operand in"""
    amax_passes: tuple[int, int, int] = (0, 0, 0)
    """extra bf16 reads of X, W, dY to find a scale in a pass of its own (per tensor or per row)"""
    wgrad_hp: bool = False
    """the weight-gradient GEMM stays in bf16 (its operands are not cast for it)"""

    def bytes_moved(self, fmt: NumericFormat, *, x: int, w: int, dy: int) -> float:
        """Bytes the quantize kernels move for operands of x, w and dy elements."""
        per_cast = HP_BYTES + fmt.bytes_per_element  # read bf16, write the element and its scale share
        return sum(
            elements * (casts * per_cast + passes * HP_BYTES)
            for elements, casts, passes in zip((x, w, dy), self.casts, self.amax_passes)
        )


NO_QUANTIZATION = Quantization(name="none")
"""bf16, fp16, tf32, fp32: operands cast (if at all) by autocast as bf16's are; nothing beyond it."""
_FP8 = {
    "tensorwise": Quantization(name="tensorwise", casts=(1, 1, 1), amax_passes=(1, 1, 1)),
    "rowwise": Quantization(name="rowwise", casts=(2, 2, 2), amax_passes=(2, 2, 2)),
    "rowwise_with_gw_hp": Quantization(
        name="rowwise_with_gw_hp", casts=(1, 2, 1), amax_passes=(1, 2, 1), wgrad_hp=True
    ),
}
_MX = {"mx": Quantization(name="mx", casts=(2, 2, 2))}
_NVFP4 = {"nvfp4": Quantization(name="nvfp4", casts=(2, 2, 2), amax_passes=(1, 1, 1))}
RECIPES: dict[str, dict[str, Quantization]] = {
    "fp8-e4m3": _FP8,
    "fp8-e5m2": _FP8,
    "mxfp8": _MX,
    "mxfp4": _MX,
    "nvfp4": _NVFP4,
}
"""Each low-bit format's recipes (the first is its default); every other format quantizes nothing."""


def recipes_of(fmt: str) -> tuple[str, ...]:
    """The recipe names format `fmt` can be priced with (("none",) for a format that quantizes nothing)."""
    return tuple(RECIPES.get(get_format(fmt).name, {"none": NO_QUANTIZATION}))


def quantization(fmt: str, recipe: str | None = None) -> Quantization:
    """Format `fmt`'s recipe `recipe` (None: its default); an unknown recipe raises ValueError."""
    table = RECIPES.get(get_format(fmt).name, {"none": NO_QUANTIZATION})
    if recipe is None:
        return next(iter(table.values()))
    if recipe not in table:
        raise ValueError(f"{fmt} has no recipe {recipe!r}; choose from {', '.join(table)}")
    return table[recipe]


def block_scaled_mma(gpu: GpuSpec) -> bool:
    """Whether the GPU's matrix units multiply block-scaled formats (MXFP8, MXFP4, NVFP4) natively.

    NVIDIA sm100 (B200, GB200): Blackwell's fifth-generation tensor cores apply the block scales in
    the MMA; Hopper and Ada multiply fp8 but no MX blocks. The registry's device rule for this is on
    its way (docs/plan.md); until then the rule is written here."""
    return gpu.compute_capability is not None and gpu.compute_capability >= (10, 0)


@dataclass(frozen=True)
class Roofline:
    """A device: memory bandwidth in bytes/s and the dense peak in FLOP/s of each format it multiplies."""

    bandwidth: float
    peaks: Mapping[str, float]
    """FLOP/s by registry format name ("bf16", "fp8-e4m3", "nvfp4", ...); absent: no matrix units for it"""
    name: str = ""

    @classmethod
    def from_peaks(cls, *, bandwidth: float, name: str = "", block_scaled: bool = True, **by_key: float) -> Roofline:
        """Peaks given by the GPU table's keys (`bf16=1e15, fp8=2e15, fp4=4e15`), shared by every format
        whose matmuls run at that key; `block_scaled` False: no MX or NVFP4 whatever the keys."""
        peaks = {
            fmt.name: by_key[fmt.peak_key]
            for fmt in FORMATS.values()
            if fmt.peak_key in by_key and (block_scaled or fmt.block == 1)
        }
        return cls(bandwidth=bandwidth, peaks=peaks, name=name)

    @classmethod
    def from_gpu(cls, gpu: GpuSpec) -> Roofline | None:
        """From a `hardware.GpuSpec` (None when the card has no bf16 peak: nothing to compare with)."""
        if not gpu.peak_flops(BASELINE):
            return None
        peaks: dict[str, float] = {}
        for fmt in FORMATS.values():
            if fmt.peak_key is None or (fmt.block > 1 and not block_scaled_mma(gpu)):
                continue
            peak = gpu.peak_flops(fmt.peak_key)
            if peak:
                peaks[fmt.name] = peak
        return cls(bandwidth=gpu.bandwidth_gbs * 1e9, peaks=peaks, name=gpu.name)

    def peak(self, fmt: str) -> float | None:
        return self.peaks.get(get_format(fmt).name)

    def runs(self, fmt: str) -> bool:
        """The device multiplies `fmt` on matrix units (the table has its peak)."""
        return self.peak(fmt) is not None


def gemm_seconds(
    m: int, k: int, n: int, *, flops: float, operand_bytes: float, out_bytes: float, bandwidth: float
) -> float:
    """(m x k) @ (k x n) -> (m x n): compute time or memory time, whichever is longer."""
    moved = operand_bytes * (m * k + k * n) + out_bytes * m * n
    return max(2.0 * m * k * n / flops, moved / bandwidth)


@dataclass(frozen=True, kw_only=True)
class LinearCost:
    """One Linear's training step (forward, dgrad, wgrad) in one format on one device."""

    format: str
    recipe: str
    gemm_s: tuple[float, float, float]
    """seconds of the forward, dgrad and wgrad GEMMs"""
    quantize_bytes: float
    quantize_s: float

    @property
    def kernel_s(self) -> float:
        return sum(self.gemm_s)

    @property
    def total_s(self) -> float:
        return self.kernel_s + self.quantize_s


def linear_cost(
    m: int, k: int, n: int, device: Roofline, *, fmt: str = BASELINE, recipe: str | None = None
) -> LinearCost:
    """A Linear of in K, out N fed M tokens, its GEMMs in format `fmt` (its recipe `recipe`, None: the
    default). Raises ValueError when the device has no peak for `fmt` (or for bf16, which a recipe's
    high-precision wgrad runs in)."""
    spec, quant = get_format(fmt), quantization(fmt, recipe)
    low, high = _gemm_format(device, spec.name), _gemm_format(device, BASELINE)
    shapes = ((m, k, n), (m, n, k), (n, m, k))  # Y = X W^T, dX = dY W, dW = dY^T X
    kinds = (low, low, high if quant.wgrad_hp else low)
    gemms = tuple(
        gemm_seconds(
            *shape, flops=peak, operand_bytes=f.bytes_per_element, out_bytes=_out_bytes(f), bandwidth=device.bandwidth
        )
        for shape, (f, peak) in zip(shapes, kinds)
    )
    moved = quant.bytes_moved(spec, x=m * k, w=k * n, dy=m * n)
    return LinearCost(
        format=spec.name,
        recipe=quant.name,
        gemm_s=(gemms[0], gemms[1], gemms[2]),
        quantize_bytes=moved,
        quantize_s=moved / device.bandwidth,
    )


def _gemm_format(device: Roofline, name: str) -> tuple[NumericFormat, float]:
    peak = device.peak(name)
    if peak is None:
        where = f" on {device.name}" if device.name else ""
        raise ValueError(f"no {name} matmul peak{where}: nothing to price its GEMMs at")
    return get_format(name), peak


def _out_bytes(fmt: NumericFormat) -> float:
    """A GEMM's output: bf16 for the 16-bit and low-bit formats, fp32 for fp32/tf32 GEMMs."""
    return max(HP_BYTES, fmt.bytes_per_element)


@dataclass(frozen=True, kw_only=True)
class Speedup:
    """bf16 time over the format's, one Linear's step: kernel-only and with its quantization."""

    kernel_only: float
    with_overhead: float
    bf16: LinearCost
    low: LinearCost


def speedup(m: int, k: int, n: int, device: Roofline, *, fmt: str, recipe: str | None = None) -> Speedup:
    """The format's predicted speedup over bf16 for a Linear of in K, out N fed M tokens (> 1: faster)."""
    bf16 = linear_cost(m, k, n, device)
    low = linear_cost(m, k, n, device, fmt=fmt, recipe=recipe)
    return Speedup(
        kernel_only=bf16.kernel_s / low.kernel_s, with_overhead=bf16.total_s / low.total_s, bf16=bf16, low=low
    )
