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

A gradient reduce dtype: `%reduce=bf16` at the end (`bf16-mixed%reduce=bf16`) all-reduces (DDP) or
reduce-scatters (FSDP2) that candidate's gradients in bf16 across the ranks of `bench --nproc-per-node N
--parallel ddp|fsdp` (`bench.parallel`; `--reduce-dtypes fp32,bf16` writes these candidates for every
precision but the reference). Without it a candidate reduces in fp32, `--reduce-dtype`'s default in train.
"""

from __future__ import annotations

from torch import nn

from ampkit.distributed.settings import REDUCE_DTYPES
from ampkit.errors import UsageError
from ampkit.options import OPTIMIZERS
from ampkit.precision import ModuleOverrides, PrecisionSpec, canonical_name, get_spec

SEPARATOR = "+"
OVERRIDE = "@"
REDUCE = "%reduce="
DEFAULT_REDUCE = "fp32"

OPTIMIZER_RANK = 0.5
"""Added to the precision's simplicity rank: a candidate with its own optimizer is one moving part
more than the plain precision (ties go to the plain one), and never simpler than the next precision."""
OVERRIDE_RANK = 0.25
"""Added for module overrides (one moving part more; with an optimizer still below the next precision)."""
REDUCE_RANK = 0.125
"""Added for a reduce dtype other than fp32 (with an optimizer and overrides still below the next precision)."""


def split_reduce(name: str) -> tuple[str, str]:
    """'bf16-mixed%reduce=bf16' -> ('bf16-mixed', 'bf16'); a candidate without one reduces in fp32."""
    head, _, dtype = name.partition(REDUCE)
    return head, dtype or DEFAULT_REDUCE


def candidate_reduce(name: str) -> str:
    """The dtype a candidate's gradients are reduced in across ranks ('fp32' unless it names one)."""
    return split_reduce(name)[1]


def split_candidate(name: str) -> tuple[str, str | None]:
    """'bf16-true+adamw-sr@vision=fp32' -> ('bf16-true', 'adamw-sr'); 'fp32' -> ('fp32', None). Canonical names."""
    precision, _, optimizer = split_reduce(name)[0].partition(OVERRIDE)[0].partition(SEPARATOR)
    return precision, (optimizer or None)


def candidate_overrides(name: str) -> ModuleOverrides:
    """The candidate's own per-module overrides ('bf16-mixed@vision=fp32' -> vision=fp32; none: empty)."""
    return ModuleOverrides.parse(split_reduce(name)[0].partition(OVERRIDE)[2], separator=OVERRIDE)


def canonical_candidate(text: str) -> str:
    """A user's 'BF16-True + adamw-sr @ vision' as its canonical name; unknown parts are one-line UsageErrors."""
    body, marked, rest = text.partition(REDUCE[0])
    name = _canonical_body(body)
    if not marked:
        return name
    key, _, dtype = rest.partition("=")
    dtype = dtype.strip().lower()
    if key.strip().lower() != REDUCE[1:-1] or dtype not in REDUCE_DTYPES:
        raise UsageError(
            f"{text.strip()!r}: write %reduce=DTYPE with DTYPE one of {', '.join(REDUCE_DTYPES)}, "
            "e.g. bf16-mixed%reduce=bf16"
        )
    if dtype != DEFAULT_REDUCE and get_spec(split_candidate(name)[0]).is_reference:
        raise UsageError(
            f"{text.strip()!r}: the reference ({name}) reduces in fp32, every candidate is compared with it; "
            f"put the reduce dtype on another precision (e.g. bf16-mixed{REDUCE}{dtype})"
        )
    return name if dtype == DEFAULT_REDUCE else f"{name}{REDUCE}{dtype}"


def _canonical_body(text: str) -> str:
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
    reduce = REDUCE_RANK if candidate_reduce(name) != DEFAULT_REDUCE else 0.0
    return get_spec(precision).simplicity + (OPTIMIZER_RANK if optimizer else 0.0) + overrides + reduce


def check_candidate_overrides(names: list[str], *, keep_fp32: str, model: nn.Module) -> None:
    """Every candidate's patterns (and `--keep-fp32`'s) each match a module of `model` (any device,
    the meta one too), else a one-line UsageError naming the pattern; before any worker starts."""
    shared = ModuleOverrides.keep_fp32(keep_fp32)
    for name in names:
        (candidate_overrides(name) + shared).resolve(model)
