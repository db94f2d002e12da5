"""Settings whose steps allocate the same tensors share one trace, and with it its extrapolation.

A memory class (`memory_class`) is the precisions whose training steps run the same ops on elements
of the same sizes:
- fp32 and tf32: TF32 is a math mode (a backend flag), no tensor differs;
- bf16-true and fp16-true: the same ops on 2-byte weights, activations and states;
- bf16-mixed and fp16-mixed: the same autocast ops on 2-byte copies of fp32 weights, and fp16's
  GradScaler on top (bf16's is torch's disabled pass-through object, which makes no tensor);
- fp8 and fp8-emulated: native fp8 is traced as its emulation (`traced_precision`).
Each class is traced once, as its first member without loss scaling (`shared_precision`: fp32,
bf16-mixed, bf16-true, fp8-emulated). A loss-scaled member's trace is that one plus the scaler's own
tensors (`with_scaler`), each a scalar filed under temporaries while it is alive (the traced step
builds its scaler fresh, so the scale and its growth tracker appear at the scale() that starts the
backward, as they do in a step traced with fp16-mixed itself):
- in the backward (and a checkpointed block's recompute): the scale (fp32), the growth tracker
  (int32) and the scaled loss (the loss's fp32);
- in the optimizer step: the scale, the growth tracker and `found_inf` (fp32, one per device), which
  `unscale_` records before clipping and the optimizer step;
- nothing in the forward.
tests/plan/traced/test_sharing.py checks that the shared trace gives the ledgers, fits and notes
of a separate fp16-mixed trace, byte for byte. Units: bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch

from ampkit.plan.numerics import get_numerics
from ampkit.plan.setting import StepSetting
from ampkit.precision import SPECS

Lines = dict[str, int]
SCALER_LINE = "temporaries"
"""the line the scaler's tensors are filed under (they are made in the backward and the optimizer step)"""
_FP32, _INT32 = torch.float32.itemsize, torch.int32.itemsize  # bytes of a scalar
SCALER_STATE_BYTES = _FP32 + _INT32
"""the scale (fp32) and its growth tracker (int32), from the first scale() on"""
SCALER_BACKWARD_BYTES = SCALER_STATE_BYTES + _FP32
"""alive through the backward: the state and the scaled loss (fp32, the loss's dtype under autocast)"""
SCALER_STEP_BYTES = SCALER_STATE_BYTES + _FP32
"""alive through the optimizer step: the state and found_inf (fp32, one per device: a trace has one)"""


@dataclass(frozen=True)
class StepTrace:
    """What one traced step leaves (`hf.MomentTracker`): per moment label, the lines at that
    moment's own peak (`moments`) and each line's own largest value under it (`line_peaks`); and each
    line's largest value over the step."""

    moments: dict[str, Lines]
    largest: Lines
    line_peaks: dict[str, Lines] = field(default_factory=dict)


def traced_precision(name: str) -> str:
    """The precision whose step is traced: native fp8 runs on sm89+ GPUs only; its emulation
    allocates the same on CPU."""
    return "fp8-emulated" if not get_numerics(name).traceable else name


def memory_class(precision: str) -> tuple:
    """Precisions whose steps allocate the same bytes (loss scaling aside: `with_scaler`)."""
    num = get_numerics(traced_precision(precision))
    return (num.param_bytes, num.compute_bytes, num.autocast, num.float8_block_linears)


def scales_loss(precision: str) -> bool:
    return SPECS[precision].loss_scaling


@functools.cache
def shared_precision(precision: str) -> str:
    """The precision a memory class is traced as: its first member (vocabulary order) that traces
    on CPU and does not scale the loss."""
    want = memory_class(precision)
    for name, spec in SPECS.items():
        if get_numerics(name).traceable and not spec.loss_scaling and memory_class(name) == want:
            return name
    return precision


@functools.cache
def attention_precision(precision: str) -> str:
    """The precision whose step runs `precision`'s attention and everything else outside the block
    Linears on the same tensors: a low-bit Linears precision's is the one with its weights, compute
    dtype and autocast and plain Linears (fp8's: bf16-mixed); any other's is its own trace's. What
    grows with the square of the sequence (eager attention's T x T scores, their softmax and masks)
    is made there, so the two share its coefficient (`sequence.SequenceModel`)."""
    num = get_numerics(traced_precision(precision))
    if not num.float8_block_linears:
        return shared_precision(precision)
    plain = (num.param_bytes, num.compute_bytes, num.autocast, False)
    for name, spec in SPECS.items():
        if get_numerics(name).traceable and not spec.loss_scaling and memory_class(name) == plain:
            return name
    return shared_precision(precision)


def shared_setting(setting: StepSetting) -> StepSetting:
    """The setting whose trace `setting` shares."""
    return replace(setting, precision=shared_precision(setting.precision))


def scaler_bytes_at(label: str) -> int:
    """Bytes of the scaler's own tensors alive at a moment (its label, or its key by position)."""
    if label == "optimizer step":
        return SCALER_STEP_BYTES
    if label.startswith("backward:") or label.endswith(" recompute"):
        return SCALER_BACKWARD_BYTES
    return 0


def with_scaler(trace: StepTrace) -> StepTrace:
    """`trace` (a step without loss scaling) plus the scaler's own tensors at each moment."""

    def plus(lines: Lines, extra: int) -> Lines:
        return {**lines, SCALER_LINE: lines[SCALER_LINE] + extra}

    moments = {label: plus(lines, scaler_bytes_at(label)) for label, lines in trace.moments.items()}
    peaks = {label: plus(lines, scaler_bytes_at(label)) for label, lines in trace.line_peaks.items()}
    largest = {**trace.largest, SCALER_LINE: max(lines[SCALER_LINE] for lines in peaks.values())}
    return StepTrace(moments=moments, largest=largest, line_peaks=peaks)


def for_setting(trace: StepTrace, setting: StepSetting) -> StepTrace:
    """The shared trace of `setting`'s class, as `setting`'s own step would have left it."""
    traced = shared_precision(setting.precision)
    return with_scaler(trace) if scales_loss(setting.precision) and not scales_loss(traced) else trace
