"""The step's own matmuls, timed in each compute dtype: the matmul ratio the budget plans with.

The device's peaks (`bench.peaks`) are a large square GEMM's. A small model's matmuls are far less
(or more) affected by a dtype: on an AMD EPYC with AVX512-BF16, a 1024^3 fp16 matmul (emulated) runs
at ~0.05x fp32's speed, the tiny model's (2048 x 128) @ (128 x 384) ones at ~0.2x to 0.5x; native
bf16 is 2-3x fp32 on the large one and no faster on the small ones. Planned from the large GEMM,
an emulated precision's step was estimated at ~10x fp32's when it took ~3x, and bench announced
twice its wall time. So fp32's worker, right after its profiled step (`bench.profile`, which records
the shapes and strides of its `mm`/`addmm`/`bmm`/`baddbmm` ops), times those GEMMs in fp32 and in
each dtype the other precisions compute in, and the budget uses their ratio (`gemm_ratio`).

Cost: each distinct shape once in fp32 and once per dtype (after one untimed call), the largest
first, until the shapes timed cover `COVER` of the step's GEMM time or the probe's `max_s` is spent:
a step runs each shape many times (the tiny model: 9 shapes, 88 GEMMs), so a dtype's probe costs
about a quarter of its step's GEMM time. The shapes are timed as they are: an emulated dtype's speed
depends on the size far more than fp32's (fp16 on that EPYC: 1.2x fp32's at 256^3, 0.1x at 512^3),
so a cut shape would not tell; so does the layout (a transposed operand, as autograd's GEMMs have:
the same emulated fp16 shape ran 2.7x faster with its second operand transposed), which the probe keeps.
Units: seconds; shapes as (batch, m, k, n).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ampkit.hardware.backend import backend_for
from ampkit.hardware.matmul import MATMUL_DTYPES

if TYPE_CHECKING:
    from torch.autograd.profiler_util import FunctionEvent

GEMM_OPS = {"aten::mm": 0, "aten::addmm": 1, "aten::bmm": 0, "aten::baddbmm": 1}
"""profiled op -> index of its first matrix operand in the op's inputs (addmm/baddbmm: after the bias)"""
COVER = 0.9  # the probe stops once the shapes it timed hold this share of fp32's GEMM time
WARM_CALL_S = 0.05  # a dtype's call predicted slower than this is timed at its first call (no untimed one)
PROBED_KEYS = ("bf16", "fp16")  # the dtypes a probe times; tf32, fp8: the device's peaks only


Shape = tuple[int, int, int, int]
"""(batch, m, k, n): (batch x m x k) @ (batch x k x n); batch 1 is a 2-D mm"""


@dataclass(frozen=True, kw_only=True)
class Gemm:
    """One distinct GEMM of the profiled step: its shape, which operands were transposed views, how
    often it ran and its self time (ms)."""

    shape: Shape
    transposed: tuple[bool, bool]
    count: int
    ms: float

    def to_list(self) -> list[Any]:
        return [list(self.shape), list(self.transposed), self.count, self.ms]

    @classmethod
    def from_list(cls, row: list[Any]) -> Gemm:
        shape, transposed, count, ms = row
        return cls(
            shape=(int(shape[0]), int(shape[1]), int(shape[2]), int(shape[3])),
            transposed=(bool(transposed[0]), bool(transposed[1])),
            count=int(count),
            ms=float(ms),
        )


def _shape_of(name: str, shapes: list[Any]) -> Shape | None:
    first = GEMM_OPS[name]
    if len(shapes) < first + 2:
        return None
    a, b = shapes[first], shapes[first + 1]
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return (1, a[0], a[1], b[1])
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return (a[0], a[1], a[2], b[2])
    return None


def _transposed(name: str, strides: list[Any] | None) -> tuple[bool, bool]:
    """Whether each matrix operand was a transposed view (its last dimension not the contiguous one)."""
    first = GEMM_OPS[name]
    if not strides or len(strides) < first + 2:
        return (False, False)

    def flag(stride: Any) -> bool:
        return isinstance(stride, list) and len(stride) >= 2 and stride[-1] != 1 and stride[-2] == 1

    return (flag(strides[first]), flag(strides[first + 1]))


def step_gemms(events: Iterable[FunctionEvent], *, device_time: bool = False) -> list[Gemm]:
    """The profiled step's distinct GEMM shapes (events recorded with `record_shapes=True`), the most
    time first."""
    found: dict[tuple[Shape, tuple[bool, bool]], list[float]] = {}
    for event in events:
        if event.name not in GEMM_OPS or not event.input_shapes:
            continue
        shape = _shape_of(event.name, list(event.input_shapes))
        if shape is None or min(shape) < 1:
            continue
        layout = _transposed(event.name, getattr(event, "structured_input_strides", None))
        spent = (event.self_device_time_total if device_time else event.self_cpu_time_total) / 1e3
        entry = found.setdefault((shape, layout), [0, 0.0])
        entry[0] += 1
        entry[1] += spent
    gemms = [Gemm(shape=shape, transposed=layout, count=int(c), ms=ms) for (shape, layout), (c, ms) in found.items()]
    return sorted(gemms, key=lambda g: -g.ms)


def _operand(
    rows: int, cols: int, batch: int, *, transposed: bool, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rows * 31 + cols)
    if transposed:  # the same values' layout as a `.t()` view: (batch, cols, rows) transposed
        return torch.randn(batch, cols, rows, generator=gen).to(device=device, dtype=dtype).transpose(1, 2)
    return torch.randn(batch, rows, cols, generator=gen).to(device=device, dtype=dtype)


def time_gemm(gemm: Gemm, dtype: torch.dtype, device: torch.device, *, warm: bool = True) -> float:
    """Seconds of one of `gemm` in `dtype`, after one untimed call (allocation, kernel choice) unless
    not `warm` (a slow one: its first call is timed, one-time costs and all)."""
    batch, m, k, n = gemm.shape
    a = _operand(m, k, batch, transposed=gemm.transposed[0], dtype=dtype, device=device)
    b = _operand(k, n, batch, transposed=gemm.transposed[1], dtype=dtype, device=device)
    if batch == 1:  # the step's mm/addmm: the 2-D kernels, not bmm's
        a, b = a[0], b[0]
    multiply = torch.mm if batch == 1 else torch.bmm
    sync = backend_for(device).synchronize  # sync points on an accelerator: around the timed call only
    with torch.no_grad():
        if warm:
            multiply(a, b)
            sync()
        start = time.perf_counter()
        multiply(a, b)
        sync()
        return time.perf_counter() - start


def gemm_ratio(
    gemms: list[Gemm], key: str, device: torch.device, *, max_s: float, bound: float | None = None
) -> dict[str, Any] | None:
    """{"ratio": fp32's GEMM seconds over `key`'s on the step's shapes, "shapes", "covered", "seconds"}
    (None: no GEMM in the step, a dtype the probe does not time, or not one shape affordable in `max_s`).
    `bound`: the device's large-matmul ratio for `key`, by which a shape's call is predicted from its
    fp32 call before it runs (pessimistic for an emulated dtype: a small GEMM suffers less), so that a
    large model's emulated GEMM (minutes at ~1 GFLOP/s) is never started past the cap."""
    if not gemms or key not in PROBED_KEYS:
        return None
    total_ms = sum(g.ms for g in gemms) or 1.0
    started = time.perf_counter()
    fp32_s = mine_s = covered_ms = 0.0
    timed = 0
    for gemm in gemms:
        one_fp32 = time_gemm(gemm, torch.float32, device)
        predicted = one_fp32 / bound if bound else one_fp32
        warm = predicted < WARM_CALL_S
        if time.perf_counter() - started + predicted * (2 if warm else 1) > max_s:
            break
        fp32_s += gemm.count * one_fp32
        mine_s += gemm.count * time_gemm(gemm, MATMUL_DTYPES[key], device, warm=warm)
        covered_ms += gemm.ms
        timed += 1
        if covered_ms >= COVER * total_ms or time.perf_counter() - started >= max_s:
            break
    if not timed:
        return None
    return {
        "ratio": fp32_s / mine_s if mine_s > 0 else None,
        "shapes": timed,
        "covered": covered_ms / total_ms,
        "seconds": time.perf_counter() - started,
    }


def probe_ratios(
    gemms: list[Gemm], bounds: Mapping[str, float | None], device: torch.device, *, max_s: float
) -> dict[str, Any]:
    """{dtype key: `gemm_ratio`'s answer} for each key of `bounds` ({key: the peaks' ratio or None})
    the probe times; each key gets `max_s`."""
    out = {}
    for key, bound in bounds.items():
        found = gemm_ratio(gemms, key, device, max_s=max_s, bound=bound)
        if found is not None and found["ratio"]:
            out[key] = found
    return out
