"""fp8 only where it pays: the fp8 recipes' face of the GEMM roofline that prices every numeric format
(`ampkit.hardware.roofline`: the GEMMs, the cast bytes of each recipe and the assumptions are written
there once; `ampkit plan --formats` compares every format with it).

A Linear is converted when its predicted speedup over bf16, its recipe's casts included, is >= 1.0.
Units: seconds; the device's peaks in FLOP/s, bandwidth in bytes/s.
"""

from __future__ import annotations

from ampkit.hardware.roofline import FP8_RECIPES, Roofline, linear_cost, speedup

RECIPES = FP8_RECIPES
FP8 = "fp8-e4m3"

__all__ = ["RECIPES", "Roofline", "linear_seconds", "predicted_speedup"]


def linear_seconds(m: int, k: int, n: int, device: Roofline, *, recipe: str | None) -> float:
    """One training step of the Linear's three GEMMs: bf16 (`recipe` None) or fp8 with `recipe`,
    its casts included."""
    if recipe is not None and recipe not in RECIPES:
        raise ValueError(f"unknown fp8 recipe {recipe!r}; choose from {', '.join(RECIPES)}")
    if recipe is None:
        return linear_cost(m, k, n, device).total_s
    return linear_cost(m, k, n, device, fmt=FP8, recipe=recipe).total_s


def predicted_speedup(m: int, k: int, n: int, device: Roofline, *, recipe: str = "tensorwise") -> float:
    """bf16 time / fp8 time for a Linear of in K, out N fed M tokens (> 1: fp8 is faster)."""
    return speedup(m, k, n, device, fmt=FP8, recipe=recipe).with_overhead
