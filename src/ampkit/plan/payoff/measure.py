"""`plan --formats --measure`: the model's block GEMMs timed on this machine's CUDA GPU, beside the prediction.

Per Linear kind, its forward, dgrad and wgrad GEMMs at the plan's tokens, in bf16 (`torch.mm`) and in
fp8 (`torch._scaled_mm`, e4m3 operands, bf16 out: one scale per tensor for tensorwise, per row and
column for rowwise, sm90+), and the quantize kernels the roofline prices (`ampkit.hardware.roofline`):
an amax, a scale and a cast per operand per layout, run eagerly (unfused: an upper bound on what
torch.compile's fused casts cost). The block-scaled formats (MXFP8, MXFP4, NVFP4) are not timed: their
kernels need sm100, which no ampkit test machine has; they are listed as such.

Timing hazards: kernels run asynchronously, so each window is an event pair read after one synchronize
(`hardware.backend`); the first calls pay for allocation and cuBLAS heuristics (warm-up calls first); a
shared GPU slows some windows (the fastest of `WINDOWS` is kept). Operands are random normal values:
GEMM time does not depend on them. Units: seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ampkit.formats import dtype_of
from ampkit.hardware import backend_for, describe_device, pick_device
from ampkit.plan.payoff.formats import Candidate

WARMUP, REPEATS, WINDOWS = 3, 10, 3
FP8 = dtype_of("fp8-e4m3")
FP8_MAX = torch.finfo(FP8).max
BF16 = dtype_of("bf16")
ROWWISE_CC = (9, 0)  # torch._scaled_mm's rowwise scales: Hopper and later
TIMED = {("fp8-e4m3", "tensorwise"), ("fp8-e4m3", "rowwise"), ("fp8-e5m2", "tensorwise"), ("fp8-e5m2", "rowwise")}


def measure_formats(block: dict[str, Any], candidates: list[Candidate], *, device: str = "auto") -> dict[str, Any]:
    """The `measured` part of the formats block: one line why not on a machine without a CUDA GPU."""
    dev = pick_device(device)
    info = describe_device(dev)
    if dev.type != "cuda" or info.kind != "cuda":
        return {"device": info.name, "skipped": f"--measure times GEMMs on an NVIDIA GPU; this is {info.name}"}
    cc = info.compute_capability or (0, 0)
    recipes = [c for c in candidates if (c.format, c.recipe) in TIMED and info.has_fp8]
    if any(c.recipe == "rowwise" for c in recipes) and cc < ROWWISE_CC:
        recipes = [c for c in recipes if c.recipe != "rowwise"]
    tokens = block["tokens"]
    layers = []
    for linear in block["linears"]:
        if linear["head"]:
            continue
        try:
            layers.append(measure_linear(dev, tokens, linear, recipes))
        except torch.OutOfMemoryError:
            layers.append({"name": linear["name"], "skipped": "out of GPU memory at these shapes"})
    untimed = [c.label for c in candidates if c not in recipes]
    return {
        "device": info.name,
        "gpu_model": info.gpu_model,
        "skipped": None,
        "timed": [c.label for c in recipes],
        "not_timed": untimed,
        "layers": layers,
    }


def measure_linear(dev: torch.device, tokens: int, linear: dict[str, Any], recipes: list[Candidate]) -> dict:
    """One Linear kind's three GEMMs in bf16 and in each fp8 recipe, with the recipe's casts (seconds)."""
    m, k, n = tokens, linear["k"], linear["n"]
    x, w, dy = (torch.randn(*shape, device=dev, dtype=BF16) for shape in ((m, k), (n, k), (m, n)))
    gemms = [(x, w), (dy, w.t().contiguous()), (dy.t().contiguous(), x.t().contiguous())]  # Y, dX, dW^T
    bf16 = sum(_seconds(dev, _bf16_gemm(a, b)) for a, b in gemms)
    out: dict[str, Any] = {"name": linear["name"], "k": k, "n": n, "bf16_s": bf16, "formats": {}}
    for candidate in recipes:
        rowwise = candidate.recipe == "rowwise"
        kernel = sum(_seconds(dev, _fp8_gemm(a, b, rowwise=rowwise)) for a, b in gemms)
        casts = 2 if rowwise else 1
        quantize = sum(casts * _seconds(dev, _quantize(t, rowwise=rowwise)) for t in (x, w, dy))
        out["formats"][candidate.label] = {
            "kernel_s": kernel,
            "quantize_s": quantize,
            "kernel_only": bf16 / kernel,
            "with_overhead": bf16 / (kernel + quantize),
        }
    return out


def _bf16_gemm(a: torch.Tensor, b: torch.Tensor) -> Callable[[], Any]:
    return lambda: torch.mm(a, b.t())


def _fp8_gemm(a: torch.Tensor, b: torch.Tensor, *, rowwise: bool) -> Callable[[], Any]:
    """a (m x k) @ b^T (b: n x k) in e4m3 with bf16 out; `_scaled_mm` takes its second operand column-major."""
    a8, b8 = a.to(FP8), b.to(FP8).t()
    one = torch.ones((), device=a.device)
    sa = torch.ones(a.shape[0], 1, device=a.device) if rowwise else one
    sb = torch.ones(1, b.shape[0], device=a.device) if rowwise else one
    return lambda: torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=BF16)


def _quantize(t: torch.Tensor, *, rowwise: bool) -> Callable[[], Any]:
    """The cast the recipe runs: amax (per tensor, or per row), the scale, the scaled cast to e4m3."""

    def cast() -> torch.Tensor:
        amax = t.abs().amax(dim=1, keepdim=True) if rowwise else t.abs().max()
        return (t * (FP8_MAX / amax.float().clamp(min=1e-12))).to(FP8)

    return cast


def _seconds(dev: torch.device, op: Callable[[], Any]) -> float:
    """Seconds of one call of `op`: the fastest of `WINDOWS` windows of `REPEATS` calls, after warm-up."""
    backend = backend_for(dev)
    for _ in range(WARMUP):
        op()
    timer = backend.step_timer()
    for _ in range(WINDOWS):
        timer.start()
        for _ in range(REPEATS):
            op()
        timer.stop()
    return min(timer.seconds()) / REPEATS
