"""A bench candidate: a precision, optionally completed by the optimizer it needs.

`--precisions fp32,bf16-true,bf16-true+adamw-sr` compares bf16-true with torch's AdamW and with
torchao's stochastic-rounding AdamW side by side: the same model, data and seed, one worker each. The
name before "+" is a precision of `ampkit.precision.SPECS` (everything about dtypes comes from its
spec); the name after it is one of `ampkit.options.OPTIMIZERS`, used by that worker only. A plain
precision name uses the bench's default optimizer (AdamW).
"""

from __future__ import annotations

from ampkit.errors import UsageError
from ampkit.options import OPTIMIZERS
from ampkit.precision import PrecisionSpec, canonical_name, get_spec

SEPARATOR = "+"

OPTIMIZER_RANK = 0.5
"""Added to the precision's simplicity rank: a candidate with its own optimizer is one moving part
more than the plain precision (ties go to the plain one), and never simpler than the next precision."""


def split_candidate(name: str) -> tuple[str, str | None]:
    """'bf16-true+adamw-sr' -> ('bf16-true', 'adamw-sr'); 'fp32' -> ('fp32', None). Names are canonical."""
    precision, _, optimizer = name.partition(SEPARATOR)
    return precision, (optimizer or None)


def canonical_candidate(text: str) -> str:
    """A user's 'BF16-True + adamw-sr' as its canonical name; unknown parts are one-line UsageErrors."""
    precision, sep, optimizer = text.partition(SEPARATOR)
    name = canonical_name(precision)
    if not sep:
        return name
    optimizer = optimizer.strip().lower()
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {optimizer!r} in {text.strip()!r}; choose one of: {', '.join(OPTIMIZERS)}")
    return f"{name}{SEPARATOR}{optimizer}"


def candidate_spec(name: str) -> PrecisionSpec:
    """The precision spec of a candidate (its optimizer does not change dtypes)."""
    return get_spec(split_candidate(name)[0])


def candidate_rank(name: str) -> float:
    """The recommendation's tie-break rank: the precision's simplicity, plus OPTIMIZER_RANK with an optimizer."""
    precision, optimizer = split_candidate(name)
    return get_spec(precision).simplicity + (OPTIMIZER_RANK if optimizer else 0.0)
