"""fp8 only where it pays: a roofline model of one Linear's training GEMMs in bf16 and in float8.

A Linear of in_features K and out_features N fed M tokens (micro-batch x sequence) runs three GEMMs
per training step, each 2*M*K*N FLOPs: output Y = X W^T, input gradient dX = dY W, weight gradient
dW = dY^T X. Each takes max(FLOPs / peak, bytes / bandwidth) (a roofline: compute- or memory-bound).
bf16 reads both operands in 2 bytes and writes its output in 2. float8 reads them in 1 byte (the
output stays bf16) at the fp8 peak, but first casts every operand it uses: read 2 bytes + find the
scale (another 2-byte read: the amax) + write 1 byte = 5 bytes an element, memory-bound kernels. The
recipes (torchao's Float8LinearConfig names) differ in what they cast:
    tensorwise          one scale per tensor: X, W and dY cast once each, all three GEMMs in fp8
    rowwise             one scale per row: X, W, dY cast along each GEMM's own axis (twice each)
    rowwise_with_gw_hp  rowwise, but dW in bf16 (its accumulation over M is the most sensitive)
predicted speedup = bf16 time / fp8 time; a Linear is converted when it is >= 1.0. Units: FLOPs,
bytes, seconds; peaks in FLOP/s, bandwidth in bytes/s (the GPU table's GB/s x 1e9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ampkit.hardware.gpus import GpuSpec

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
BF16_BYTES, FP8_BYTES = 2, 1
CAST_BYTES = 5  # per element cast: read 2 (bf16) + amax read 2 + write 1 (fp8)


@dataclass(frozen=True)
class Roofline:
    """The device: dense peaks in FLOP/s and memory bandwidth in bytes/s."""

    bf16_flops: float
    fp8_flops: float
    bandwidth: float

    @classmethod
    def from_gpu(cls, gpu: GpuSpec) -> Roofline | None:
        """From a `hardware.GpuSpec` (None when the card has no fp8 peak)."""
        bf16, fp8 = gpu.peak_flops("bf16"), gpu.peak_flops("fp8")
        if not bf16 or not fp8:
            return None
        return cls(bf16_flops=bf16, fp8_flops=fp8, bandwidth=gpu.bandwidth_gbs * 1e9)


def _gemm_seconds(m: int, k: int, n: int, *, flops: float, operand_bytes: int, bandwidth: float) -> float:
    """(m x k) @ (k x n) -> (m x n), output in bf16."""
    moved = operand_bytes * (m * k + k * n) + BF16_BYTES * m * n
    return max(2.0 * m * k * n / flops, moved / bandwidth)


def _cast_seconds(elements: int, bandwidth: float) -> float:
    return CAST_BYTES * elements / bandwidth


def linear_seconds(m: int, k: int, n: int, device: Roofline, *, recipe: str | None) -> float:
    """One training step of the Linear's three GEMMs: bf16 (`recipe` None) or fp8 with `recipe`."""
    shapes = [(m, k, n), (m, n, k), (n, m, k)]  # Y = X W^T, dX = dY W, dW = dY^T X
    if recipe is None:
        return sum(
            _gemm_seconds(*s, flops=device.bf16_flops, operand_bytes=BF16_BYTES, bandwidth=device.bandwidth)
            for s in shapes
        )
    if recipe not in RECIPES:
        raise ValueError(f"unknown fp8 recipe {recipe!r}; choose from {', '.join(RECIPES)}")

    def fp8(shape: tuple[int, int, int]) -> float:
        return _gemm_seconds(*shape, flops=device.fp8_flops, operand_bytes=FP8_BYTES, bandwidth=device.bandwidth)

    def bf16(shape: tuple[int, int, int]) -> float:
        return _gemm_seconds(*shape, flops=device.bf16_flops, operand_bytes=BF16_BYTES, bandwidth=device.bandwidth)

    gemms = [fp8(shapes[0]), fp8(shapes[1]), bf16(shapes[2]) if recipe == "rowwise_with_gw_hp" else fp8(shapes[2])]
    x, w, dy = m * k, k * n, m * n
    casts = {"tensorwise": x + w + dy, "rowwise": 2 * (x + w + dy), "rowwise_with_gw_hp": x + w + 2 * dy}[recipe]
    return sum(gemms) + _cast_seconds(casts, device.bandwidth)


def predicted_speedup(m: int, k: int, n: int, device: Roofline, *, recipe: str = "tensorwise") -> float:
    """bf16 time / fp8 time for a Linear of in K, out N fed M tokens (> 1: fp8 is faster)."""
    return linear_seconds(m, k, n, device, recipe=None) / linear_seconds(m, k, n, device, recipe=recipe)


@dataclass(frozen=True)
class LayerPrediction:
    name: str
    m: int
    k: int
    n: int
    speedup: float
    flops: float
    """training FLOPs of the layer's three GEMMs (6 M K N)"""
    bf16_s: float
    fp8_s: float

    @property
    def converted(self) -> bool:
        return self.speedup >= 1.0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "m": self.m,
            "k": self.k,
            "n": self.n,
            "speedup": self.speedup,
            "flops": self.flops,
            "converted": self.converted,
        }


def predict_layers(
    layers: list[tuple[str, int, int]], *, tokens: int, device: Roofline, recipe: str = "tensorwise"
) -> list[LayerPrediction]:
    """Per Linear (name, in_features, out_features), fed `tokens` rows: its predicted speedup."""
    out = []
    for name, k, n in layers:
        bf16 = linear_seconds(tokens, k, n, device, recipe=None)
        fp8 = linear_seconds(tokens, k, n, device, recipe=recipe)
        out.append(LayerPrediction(name, tokens, k, n, bf16 / fp8, 6.0 * tokens * k * n, bf16, fp8))
    return out


def end_to_end(predictions: list[LayerPrediction], *, other_seconds: float = 0.0) -> dict:
    """The step's predicted gain when the layers predicted to pay are converted (others stay bf16);
    `other_seconds` is the step's time outside these Linears (attention, norms: unchanged)."""
    bf16 = sum(p.bf16_s for p in predictions) + other_seconds
    fp8 = sum(p.fp8_s if p.converted else p.bf16_s for p in predictions) + other_seconds
    total_flops = sum(p.flops for p in predictions)
    converted_flops = sum(p.flops for p in predictions if p.converted)
    return {
        "speedup": bf16 / fp8 if fp8 else 1.0,
        "converted_flops_share": converted_flops / total_flops if total_flops else 0.0,
        "converted_layers": sum(p.converted for p in predictions),
        "layers": len(predictions),
    }
