"""Adam's epsilon against the format its optimizer states are stored in.

AdamW divides by sqrt(v) + eps. ampkit's eps is 1e-8 (`core.optim.ADAMW_EPS`); fp16's smallest
subnormal is 2^-24 = 5.96e-8 (`ampkit.formats`), so 1e-8 rounds to 0 in fp16 (anything below half
of it, 2.98e-8, does). Where the states are fp16 (the "-true" fp16 precision keeps them in the
weights' dtype) an AdamW that computes in its states' dtype (torch's foreach and single-tensor
paths, most hand-written ones) then divides by sqrt(v) + 0: inf where v flushed to zero, NaN (0/0)
where the gradient is 0. v flushes on the first step for |g| < sqrt(2^-25 / (1 - beta2)) = 7.7e-4 at
ampkit's beta2 = 0.95. ampkit's own AdamW is torch's fused one, which computes in fp32 and keeps eps,
but the v it stores in fp16 still flushes below that gradient. The fix: fp32 states (a mixed
precision: fp32 master weights and states), or an eps fp16 holds with room (>= 1e-4, above the
flushed v's floor). bf16 and fp32 hold 1e-8 (their exponent reaches ~1e-38).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ampkit.core.optim import ADAMW_BETAS, ADAMW_EPS
from ampkit.diagnostics.range_target import format_target
from ampkit.formats import dtype_of, name_of
from ampkit.precision import get_spec
from ampkit.records import Record

SAFE_EPS = 1e-4
"""An eps for fp16 states: representable, and above sqrt(v) of a gradient that flushes v to zero."""
STATES_IN_WEIGHT_DTYPE = ("adamw", "adamw-sr", "adamw-kahan")
"""`core.optim`'s optimizers whose eps-guarded states live in the weights' dtype (adamw-8bit quantizes its
states to 8 bits under fp32 scales; sgd has no eps)."""


@dataclass(frozen=True, kw_only=True)
class EpsHazard(Record):
    """An eps the optimizer states' format rounds to zero."""

    precision: str
    state_format: str
    """the format the optimizer states are stored in (the weights' under a -true precision)"""
    eps: float
    smallest_subnormal: float
    """the format's smallest positive value; eps below half of it rounds to 0"""
    eps_stored: float
    """eps as that format stores it (0.0: lost)"""
    flush_grad: float
    """|gradient| below which the first step's v = (1 - beta2) g^2 flushes to zero in that format"""


def state_format(precision: str) -> str:
    """The format `precision` stores the weights, and so AdamW's states, in ("fp32" for mixed ones)."""
    return name_of(get_spec(precision).param_dtype) or "fp32"


def adam_eps_hazard(precision: str, *, eps: float = ADAMW_EPS, beta2: float = ADAMW_BETAS[1]) -> EpsHazard | None:
    """The hazard when `precision` keeps AdamW's states in a format whose smallest subnormal exceeds
    `eps` (fp16-true with ampkit's 1e-8); None when the states hold it (fp32, bf16)."""
    fmt = state_format(precision)
    target = format_target(fmt)
    if eps >= target.smallest_subnormal:
        return None
    stored = float(torch.tensor(eps, dtype=dtype_of(fmt)))  # round-to-nearest: 0.0 below half the subnormal
    return EpsHazard(
        precision=get_spec(precision).name,
        state_format=fmt,
        eps=eps,
        smallest_subnormal=target.smallest_subnormal,
        eps_stored=stored,
        flush_grad=math.sqrt(target.smallest_subnormal / 2 / (1 - beta2)),
    )


def eps_text(h: EpsHazard) -> tuple[str, list[str], str]:
    """(title, evidence, fix) of the advice `adam_eps_fp16`."""
    title = (
        f"AdamW's eps {h.eps:g} is below {h.state_format}'s smallest subnormal {h.smallest_subnormal:.3g}: "
        f"{h.precision} stores the optimizer states in {h.state_format}"
    )
    evidence = [
        f"eps {h.eps:g} stored in {h.state_format} is {h.eps_stored:g}",
        f"an AdamW computing in its {h.state_format} states divides by sqrt(v) + {h.eps_stored:g}: inf where v "
        f"flushed to zero (|g| < {h.flush_grad:.2g} on the first step), NaN where the gradient is 0",
        "ampkit's fused AdamW computes in fp32 and keeps eps, but the v it stores still flushes below that |g|",
    ]
    fix = (
        "keep the optimizer states in fp32: --precision fp16-mixed (fp32 master weights and states) or bf16-mixed; "
        f"an optimizer that must compute in {h.state_format} needs eps >= {SAFE_EPS:g}"
    )
    return title, evidence, fix


def train_warnings(precision: str, optimizer: str) -> list[str]:
    """`ampkit train`'s warning, before anything is built, when `optimizer` keeps fp16 states whose eps is lost."""
    hazard = adam_eps_hazard(precision) if optimizer in STATES_IN_WEIGHT_DTYPE else None
    if hazard is None:
        return []
    return [
        f"{hazard.precision} keeps {optimizer}'s states in {hazard.state_format}, where its eps {hazard.eps:g} is "
        f"{hazard.eps_stored:g} (smallest subnormal {hazard.smallest_subnormal:.3g}) and v flushes for "
        f"|g| < {hazard.flush_grad:.2g}: keep the states in fp32 (--precision fp16-mixed); ampkit doctor explains"
    ]
