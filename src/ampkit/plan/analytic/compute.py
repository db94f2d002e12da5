"""Compute: training FLOPs per token and per step, step time at a GPU's peak and at an assumed MFU.

FLOPs per trained token = 6N + 12 * layers * (heads * head_dim) * T (PaLM appendix B), N the
parameters that multiply (`ModelDescription.matmul_parameters`, the same convention as
`ampkit.models.flops`). Full activation checkpointing recomputes the forward (2N of the 6N), so the
hardware does 8/6 of the model FLOPs; MFU counts model FLOPs only, as is conventional.
Units: FLOPs (operations), FLOP/s (rate), seconds; GB = 1000**3 bytes where the seeds' weight
figures are reproduced (`weights_gb`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.hardware import GpuSpec
from ampkit.hardware.mfu import achievable_mfu, sibling_mfu
from ampkit.plan.describe import ModelDescription
from ampkit.plan.numerics import get_numerics
from ampkit.records import Record

RECOMPUTE_FACTOR = 8 / 6  # forward recomputed once under full checkpointing
DEFAULT_MFU = 0.4
"""the MFU assumed where neither --mfu nor the achievable-MFU table (`hardware/mfu.py`) gives one"""


def mfu_for(gpu: GpuSpec | None, peak_key: str, *, given: float) -> tuple[float, str, str | None]:
    """(MFU, source, note) for one precision's peak on `gpu`: `given` (--mfu) when > 0; else the table's
    published figure for that GPU and peak; else the MFU of the GPU's own row for another precision
    (`sibling_mfu`: bf16's), else DEFAULT_MFU. Either fallback keeps the datasheet's ratio to the
    precision it borrows from (the note says so): a ratio no run measured is not invented (an fp32 at
    DEFAULT_MFU beside bf16 at a higher published MFU would put A100's bf16 22x over fp32)."""
    if given > 0:
        return given, "--mfu", None
    row = achievable_mfu(gpu.name, peak_key) if gpu is not None else None
    if row is not None:
        return row.mfu, "table", f"{row.tokens_per_s:,.0f} tokens/s/GPU: {row.setting}; {row.source}"
    where = gpu.name if gpu is not None else "no GPU"
    sibling = sibling_mfu(gpu.name) if gpu is not None else None
    if sibling is not None:
        note = (
            f"datasheet ratio: no achievable-MFU row for {where} {peak_key}; its {sibling.peak_key} row's MFU "
            f"{sibling.mfu:.2f} assumed (the datasheet's {peak_key}/{sibling.peak_key} ratio)"
        )
        return sibling.mfu, "datasheet", note
    note = f"datasheet ratio: no achievable-MFU row for {where} {peak_key}, MFU {DEFAULT_MFU:g} assumed"
    return DEFAULT_MFU, "datasheet", note


def flops_per_token(n_matmul_params: float, *, attention_flops: float = 0.0) -> float:
    """6N (+ the attention term): forward 2N, backward 4N."""
    return 6.0 * n_matmul_params + attention_flops


def attention_flops_per_token(desc: ModelDescription, seq_len: int) -> float:
    """12 * layers * (heads * head_dim) * T over the full T x T square (PaLM's convention)."""
    return 12.0 * desc.n_layers * desc.q_dim * seq_len


def model_flops_per_token(desc: ModelDescription, seq_len: int) -> float:
    return flops_per_token(desc.matmul_parameters(), attention_flops=attention_flops_per_token(desc, seq_len))


def seconds_at(flops: float, peak_flops_per_s: float, *, mfu: float = 1.0) -> float:
    """Time to do `flops` at `mfu` of a `peak_flops_per_s` device."""
    return flops / (peak_flops_per_s * mfu)


def weights_gb(n_params: float, bytes_per_param: int) -> float:
    """Weight storage in decimal GB (1000**3 bytes), the unit of the seeds' "28 GB" figure."""
    return n_params * bytes_per_param / 1e9


@dataclass(frozen=True, kw_only=True)
class StepCompute(Record):
    """One optimizer step's FLOPs and time on one GPU."""

    precision: str
    peak_key: str
    """the GPU peak column used (fp32, tf32, fp16, bf16, fp8)"""
    flops_per_token: float
    tokens_per_step: int
    flops_per_step: float
    """model FLOPs (checkpointing's recompute not included)"""
    peak_flops: float | None
    """the GPU's dense peak FLOP/s for this regime's matmuls; None when it has no such path"""
    step_s_at_peak: float | None
    step_s_at_mfu: float | None
    tokens_per_s: float | None
    """at the assumed MFU"""
    hours_per_billion_tokens: float | None
    mfu: float = DEFAULT_MFU
    """the MFU the step time assumes (a fraction)"""
    mfu_source: str = "--mfu"
    """"--mfu" (given), "table" (`hardware/mfu.py`, per GPU and precision) or "datasheet" (no row: DEFAULT_MFU)"""
    mfu_note: str | None = None
    """the table row's throughput, setting and URL, or why the figure is a datasheet ratio"""


def step_compute(
    desc: ModelDescription,
    *,
    precision: str,
    seq_len: int,
    tokens_per_step: int,
    gpu: GpuSpec | None,
    mfu: float,
    checkpointing: bool = False,
) -> StepCompute:
    """FLOPs and (with a GPU) time of a step of `tokens_per_step` tokens at context `seq_len`; `mfu` 0:
    per GPU and precision (`mfu_for`)."""
    num = get_numerics(precision)
    per_token = model_flops_per_token(desc, seq_len)
    flops = per_token * tokens_per_step
    peak = gpu.peak_flops(num.peak_key) if gpu is not None else None
    mfu, source, note = mfu_for(gpu, num.peak_key, given=mfu)
    work = flops * (RECOMPUTE_FACTOR if checkpointing else 1.0)
    at_peak = seconds_at(work, peak) if peak else None
    at_mfu = seconds_at(work, peak, mfu=mfu) if peak else None
    tokens_per_s = tokens_per_step / at_mfu if at_mfu else None
    return StepCompute(
        precision=num.name,
        peak_key=num.peak_key,
        flops_per_token=per_token,
        tokens_per_step=tokens_per_step,
        flops_per_step=flops,
        peak_flops=peak,
        step_s_at_peak=at_peak,
        step_s_at_mfu=at_mfu,
        tokens_per_s=tokens_per_s,
        hours_per_billion_tokens=(1e9 / tokens_per_s / 3600) if tokens_per_s else None,
        mfu=mfu,
        mfu_source=source,
        mfu_note=note if peak else None,
    )
