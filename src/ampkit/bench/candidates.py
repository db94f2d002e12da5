"""A bench candidate: a precision, optionally completed by the optimizer it needs and by per-module overrides.

`--precisions fp32,bf16-true,bf16-true+adamw-sr` compares bf16-true with torch's AdamW and with
torchao's stochastic-rounding AdamW side by side: the same model, data and seed, one worker each. The
name before "+" is a precision of `ampkit.precision.SPECS` (everything about dtypes comes from its
spec); the name after it is one of `ampkit.options.OPTIMIZERS`, used by that worker only. A plain
precision name uses the bench's default optimizer (AdamW).

Per-part candidates: each `@PATTERN=REGIME` after the name keeps the modules PATTERN names in REGIME
(`ampkit.precision.ModuleOverrides`: a module path, a glob, or a VLM's part vision, projector or
language; REGIME fp32, bf16-true or fp16-true); `@PATTERN` alone is `@PATTERN=fp32`, as `--keep-fp32`
writes it. `--precisions fp32,bf16-mixed,bf16-mixed@vision=fp32,bf16-true@vision=fp32` compares the
whole-model precisions with a vision tower kept in fp32. "@" never clashes with "+" (an optimizer) or
"," (the list); the canonical form is `PRECISION[+OPTIMIZER][@PATTERN=REGIME...]`. The reference (fp32)
takes none: it is what every candidate is compared with. `--keep-fp32` applies to every candidate.
"""

from __future__ import annotations

from torch import nn

from ampkit.errors import UsageError
from ampkit.options import OPTIMIZERS
from ampkit.precision import ModuleOverrides, PrecisionSpec, canonical_name, get_spec

SEPARATOR = "+"
OVERRIDE = "@"

OPTIMIZER_RANK = 0.5
"""Added to the precision's simplicity rank: a candidate with its own optimizer is one moving part
more than the plain precision (ties go to the plain one), and never simpler than the next precision."""
OVERRIDE_RANK = 0.25
"""Added for module overrides (one moving part more; with an optimizer still below the next precision)."""


def split_candidate(name: str) -> tuple[str, str | None]:
    """'bf16-true+adamw-sr@vision=fp32' -> ('bf16-true', 'adamw-sr'); 'fp32' -> ('fp32', None). Canonical names."""
    precision, _, optimizer = name.partition(OVERRIDE)[0].partition(SEPARATOR)
    return precision, (optimizer or None)


def candidate_overrides(name: str) -> ModuleOverrides:
    """The candidate's own per-module overrides ('bf16-mixed@vision=fp32' -> vision=fp32; none: empty)."""
    return ModuleOverrides.parse(name.partition(OVERRIDE)[2], separator=OVERRIDE)


def canonical_candidate(text: str) -> str:
    """A user's 'BF16-True + adamw-sr @ vision' as its canonical name; unknown parts are one-line UsageErrors."""
    head, at, tail = text.partition(OVERRIDE)
    precision, sep, optimizer = head.partition(SEPARATOR)
    name = canonical_name(precision)
    if sep:
        optimizer = optimizer.strip().lower()
        if optimizer not in OPTIMIZERS:
            raise UsageError(
                f"unknown optimizer {optimizer!r} in {text.strip()!r}; choose one of: {', '.join(OPTIMIZERS)}"
            )
        name = f"{name}{SEPARATOR}{optimizer}"
    if not at:
        return name
    if get_spec(name.partition(SEPARATOR)[0]).is_reference:
        raise UsageError(
            f"{text.strip()!r}: the reference ({name}) runs whole, every candidate is compared with it; "
            f"put the override on another precision (e.g. bf16-mixed{OVERRIDE}{tail.strip()})"
        )
    items = [p.strip() for p in tail.split(OVERRIDE)]
    if not all(items):
        raise UsageError(
            f"{text.strip()!r}: each {OVERRIDE} needs PATTERN=REGIME after it, e.g. bf16-mixed@vision=fp32"
        )
    written = [item if "=" in item else f"{item}=fp32" for item in items]
    overrides = ModuleOverrides.parse(OVERRIDE.join(written), separator=OVERRIDE)
    return name + "".join(f"{OVERRIDE}{o}" for o in overrides.items)


def candidate_spec(name: str) -> PrecisionSpec:
    """The precision spec of a candidate (its optimizer and overrides do not change its regime)."""
    return get_spec(split_candidate(name)[0])


def candidate_rank(name: str) -> float:
    """The recommendation's tie-break rank: the precision's simplicity, plus OPTIMIZER_RANK with an optimizer
    and OVERRIDE_RANK with module overrides."""
    precision, optimizer = split_candidate(name)
    overrides = OVERRIDE_RANK if candidate_overrides(name) else 0.0
    return get_spec(precision).simplicity + (OPTIMIZER_RANK if optimizer else 0.0) + overrides


def check_candidate_overrides(names: list[str], *, keep_fp32: str, model: nn.Module) -> None:
    """Every candidate's patterns (and `--keep-fp32`'s) each match a module of `model` (any device,
    the meta one too), else a one-line UsageError naming the pattern; before any worker starts."""
    shared = ModuleOverrides.keep_fp32(keep_fp32)
    for name in names:
        (candidate_overrides(name) + shared).resolve(model)
