"""Will a format pay on this model's shapes? Per GPU and format: each Linear's predicted speedup over
bf16 (kernel-only and with its quantization), which Linears are worth converting, and the whole step.

A low-bit format's Linear converts when it meets the format's shape rule (in and out features multiples
of the block: fp8 16, MX 32, NVFP4 16), is not the head (kept in bf16 by every converter ampkit drives)
and its predicted speedup with the quantize kernels is above `WORTH_CONVERTING`. The step's estimate
converts exactly those (Amdahl: the rest of the step, `other.py`, is unchanged); "kernel-only" is the
block's Linears all converted and their casts free, Transformer Engine's "pre-quantized" figure.
fp16, tf32 and fp32 are whole-model precisions (autocast's dtype, the TF32 switch), not a per-Linear
choice: every Linear, the head too, is priced in them, and the rest of the step as bf16's (which makes
fp32's and tf32's step an optimistic bound: their elementwise kernels move twice the bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampkit.formats import get_format
from ampkit.hardware import GpuSpec
from ampkit.hardware.roofline import BASELINE, NO_QUANTIZATION, Roofline, block_scaled_mma, linear_cost, quantization
from ampkit.plan.describe import ModelDescription
from ampkit.plan.payoff.filters import torchao_filter
from ampkit.plan.payoff.formats import Candidate
from ampkit.plan.payoff.other import OtherTime, other_time
from ampkit.plan.payoff.shapes import LinearShape, model_linears

WORTH_CONVERTING = 1.0
"""A Linear converts when its predicted speedup with its casts is above this."""
WORTH_IT = 1.05
"""Below this predicted step gain, a format is not worth its fidelity risk (the plan's fp8 warning)."""
FP8_DIMS = 16
"""fp8's shape rule: torchao's float8 (cuBLAS/CUTLASS) GEMMs need in and out features divisible by 16."""


def dim_multiple(candidate: Candidate) -> int:
    """The shape rule of a converted Linear: its in and out features multiples of this (1: none).
    Block formats: their block (MX 32, NVFP4 16); fp8: 16; the 16- and 32-bit formats: none."""
    fmt = get_format(candidate.format)
    if fmt.block > 1:
        return fmt.block
    return FP8_DIMS if fmt.bits == 8 else 1


@dataclass(frozen=True, kw_only=True)
class LayerVerdict:
    name: str
    k: int
    n: int
    count: int
    kernel_only: float
    with_overhead: float
    bf16_s: float
    """one of it, one micro-batch's step (its three GEMMs) in bf16"""
    low_s: float
    """the same in the format, quantize kernels included"""
    quantize_bytes: float
    reason: str | None
    """why it stays bf16 (None: it converts)"""

    @property
    def converted(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "k": self.k,
            "n": self.n,
            "count": self.count,
            "kernel_only": self.kernel_only,
            "with_overhead": self.with_overhead,
            "bf16_s": self.bf16_s,
            "low_s": self.low_s,
            "quantize_bytes": self.quantize_bytes,
            "converted": self.converted,
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True)
class FormatPrediction:
    candidate: Candidate
    note: str | None = None
    """why it is not predicted on this GPU (no matmul peak, no block-scaled MMA); None: predicted"""
    layers: list[LayerVerdict] = field(default_factory=list)
    kernel_only: float | None = None
    with_overhead: float | None = None
    step_speedup: float | None = None
    step_kernel_only: float | None = None
    converted_share: float | None = None
    """share of the Linears' bf16 GEMM time in the Linears that convert"""
    filter: dict[str, Any] | None = None
    warning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.candidate.to_dict(),
            "predicted": self.note is None,
            "note": self.note,
            "kernel_only": self.kernel_only,
            "with_overhead": self.with_overhead,
            "step_speedup": self.step_speedup,
            "step_kernel_only": self.step_kernel_only,
            "converted_share": self.converted_share,
            "converted_layers": [v.name for v in self.layers if v.converted],
            "layers": [v.to_dict() for v in self.layers],
            "filter": self.filter,
            "warning": self.warning,
        }


@dataclass(frozen=True, kw_only=True)
class GpuPrediction:
    gpu: str
    bandwidth_gbs: float
    other: OtherTime
    linears_bf16_s: float
    """the model's Linears in bf16, one micro-batch (every block's and the head)"""
    formats: list[FormatPrediction]

    @property
    def bf16_step_s(self) -> float:
        return self.linears_bf16_s + self.other.total_s

    @property
    def gemm_share(self) -> float:
        """The Linears' share of the bf16 step: Amdahl's parallel part."""
        return self.linears_bf16_s / self.bf16_step_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "bandwidth_gbs": self.bandwidth_gbs,
            "bf16_step_s": self.bf16_step_s,
            "linears_bf16_s": self.linears_bf16_s,
            "other": self.other.to_dict(),
            "gemm_share": self.gemm_share,
            "amdahl_bound": 1.0 / (1.0 - self.gemm_share),
            "formats": [f.to_dict() for f in self.formats],
        }


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What one micro-batch's step is: the model's Linears fed `tokens` rows, and its non-GEMM part."""

    desc: ModelDescription
    micro_batch: int
    seq_len: int
    grad_accum: int = 1
    shards: int = 1
    """ranks the weights and optimizer states are sharded over (FSDP), else 1"""

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    def linears(self) -> list[LinearShape]:
        return model_linears(self.desc)


def predict_gpu(work: Workload, gpu: GpuSpec, candidates: list[Candidate]) -> GpuPrediction | None:
    """Every candidate on `gpu` (None when the card has no bf16 peak to compare with)."""
    device = Roofline.from_gpu(gpu)
    if device is None:
        return None
    linears = work.linears()
    other = other_time(
        work.desc,
        micro_batch=work.micro_batch,
        seq_len=work.seq_len,
        grad_accum=work.grad_accum,
        device=device,
        shards=work.shards,
    )
    bf16 = sum(linear_cost(work.tokens, s.k, s.n, device).total_s * s.count for s in linears)
    formats = [_predict_format(work, gpu, device, c, linears, other) for c in candidates]
    return GpuPrediction(
        gpu=gpu.name, bandwidth_gbs=gpu.bandwidth_gbs, other=other, linears_bf16_s=bf16, formats=formats
    )


def _not_run(gpu: GpuSpec, candidate: Candidate) -> str | None:
    fmt = get_format(candidate.format)
    if fmt.block > 1 and not block_scaled_mma(gpu):
        return f"{gpu.name} has no block-scaled MMA for {fmt.name} (NVIDIA sm100, e.g. B200)"
    if fmt.peak_key is None or not gpu.peak_flops(fmt.peak_key):
        return f"{gpu.name} has no {fmt.peak_key or fmt.name} matmul peak"
    return None


def _predict_format(
    work: Workload, gpu: GpuSpec, device: Roofline, candidate: Candidate, linears: list[LinearShape], other: OtherTime
) -> FormatPrediction:
    note = _not_run(gpu, candidate)
    if note is not None:
        return FormatPrediction(candidate=candidate, note=note)
    whole_model = quantization(candidate.format, candidate.recipe) is NO_QUANTIZATION
    verdicts = [_verdict(work.tokens, device, candidate, shape, whole_model=whole_model) for shape in linears]
    block = [v for v in verdicts if not _is_head(v, linears)]
    bf16_block = sum(v.bf16_s * v.count for v in block)
    kernel_bf16 = sum(_kernel_s(work.tokens, device, BASELINE, None, v) * v.count for v in block)
    kernel_low = sum(_kernel_s(work.tokens, device, candidate.format, candidate.recipe, v) * v.count for v in block)
    low_block = sum(v.low_s * v.count for v in block)
    bf16_step = sum(v.bf16_s * v.count for v in verdicts) + other.total_s
    step = sum((v.low_s if v.converted else v.bf16_s) * v.count for v in verdicts) + other.total_s
    step_kernel = bf16_step - sum(
        (v.bf16_s - _kernel_s(work.tokens, device, candidate.format, candidate.recipe, v)) * v.count
        for v in verdicts
        if v.converted
    )
    converted_bf16 = sum(v.bf16_s * v.count for v in verdicts if v.converted)
    where = f"{gpu.name}, {work.tokens} tokens a micro-batch"
    skipped, converted = [v.name for v in verdicts if not v.converted], [v.name for v in verdicts if v.converted]
    prediction = FormatPrediction(
        candidate=candidate,
        layers=verdicts,
        kernel_only=kernel_bf16 / kernel_low,
        with_overhead=bf16_block / low_block,
        step_speedup=bf16_step / step,
        step_kernel_only=bf16_step / step_kernel,
        converted_share=converted_bf16 / sum(v.bf16_s * v.count for v in verdicts),
        filter=torchao_filter(candidate, skipped=skipped, converted=converted, where=where)
        if not whole_model
        else None,
    )
    return _with_warning(prediction, where, whole_model=whole_model)


def _with_warning(prediction: FormatPrediction, where: str, *, whole_model: bool) -> FormatPrediction:
    gain = prediction.step_speedup
    if gain is None or gain >= WORTH_IT:
        return prediction
    label = prediction.candidate.label
    if whole_model:
        warning = f"{label} is predicted at {gain:.2f}x the bf16 step ({where}): stay in bf16"
    else:
        paid = sum(v.converted for v in prediction.layers)
        warning = (
            f"{label} is predicted to gain only {gain:.2f}x on the step ({paid} of {len(prediction.layers)} "
            f"Linear kinds pay; {where}): stay in bf16"
        )
    return FormatPrediction(**{**prediction.__dict__, "warning": warning})


def _is_head(verdict: LayerVerdict, linears: list[LinearShape]) -> bool:
    return any(s.head and s.name == verdict.name for s in linears)


def _kernel_s(tokens: int, device: Roofline, fmt: str, recipe: str | None, v: LayerVerdict) -> float:
    return linear_cost(tokens, v.k, v.n, device, fmt=fmt, recipe=recipe).kernel_s


def _verdict(
    tokens: int, device: Roofline, candidate: Candidate, shape: LinearShape, *, whole_model: bool
) -> LayerVerdict:
    bf16 = linear_cost(tokens, shape.k, shape.n, device)
    low = linear_cost(tokens, shape.k, shape.n, device, fmt=candidate.format, recipe=candidate.recipe)
    with_overhead = bf16.total_s / low.total_s
    multiple = dim_multiple(candidate)
    reason = None
    if whole_model:
        pass  # a precision of the whole model: every Linear runs in it
    elif shape.head:
        reason = "the output head: kept in bf16"
    elif shape.k % multiple or shape.n % multiple:
        reason = f"{shape.k}x{shape.n}: in and out features must be multiples of {multiple}"
    elif with_overhead <= WORTH_CONVERTING:
        reason = f"no faster: {with_overhead:.2f}x with its casts"
    return LayerVerdict(
        name=shape.name,
        k=shape.k,
        n=shape.n,
        count=shape.count,
        kernel_only=bf16.kernel_s / low.kernel_s,
        with_overhead=with_overhead,
        bf16_s=bf16.total_s,
        low_s=low.total_s,
        quantize_bytes=low.quantize_bytes,
        reason=reason,
    )
