"""The per-module precision overrides (`--keep-fp32`, `--module-precision`) in the plan and the fit check.

A VLM's ledger is per part (`plan/vlm/ledger.py`), each part in its own precision: an override naming
a part (vision, projector, language) becomes that part's precision (`part_precisions`), and the whole
part is counted in it (weights, gradients, optimizer states, activations; an fp32 island as fp32).

A causal LM's ledger has one storage dtype for every weight, so an override is counted in what follows
the weights' dtype: the overridden modules' parameters (resolved on the model built on the meta
device, as the policy resolves them) move from the step's storage dtype to the regime's on the
"parameters" line, their optimizer states with them (`plan.optim`'s bytes in the regime's dtype: alive
at every moment after the first step, so exact), and their gradients (the same dtype as the weights)
on the "gradients" line: in full where the line is largest, and at the peak in the share of the
gradients alive then (the overridden ones assumed spread like the rest: an estimate). Not counted
yet: their activations (fp32 inside an island) and the framework reserve over the changed peak.
Units: bytes and elements.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.plan.describe import ModelDescription
from ampkit.plan.numerics import get_numerics
from ampkit.plan.optim import optimizer_state_bytes
from ampkit.plan.setting import Ledger, StepSetting
from ampkit.precision import ModuleOverrides
from ampkit.precision.overrides import PART_NAMES


def meta_model(desc: ModelDescription) -> nn.Module | None:
    """`desc`'s causal LM on the meta device (no memory), or None where ampkit builds none for it."""
    from ampkit.plan.describe.hf import HFDescription, meta_model

    if isinstance(desc, HFDescription):
        return meta_model(desc.hf_config, desc.name)
    if desc.model_config is None:
        return None
    from ampkit.models import LlamaLM

    with torch.device("meta"):
        return LlamaLM(desc.model_config)


def kept_parameters(desc: ModelDescription, overrides: ModuleOverrides) -> dict[torch.dtype, int]:
    """Elements of the overridden parameters per storage dtype ({} without overrides or a buildable
    model); a pattern that matches no module of the model is a one-line UsageError."""
    if not overrides:
        return {}
    model = meta_model(desc)
    if model is None:
        return {}
    params = dict(model.named_parameters())  # a tied weight once, under its first name
    counts: Counter[torch.dtype] = Counter()
    for name, dtype in overrides.parameters_by_dtype(model).items():
        if name in params:
            counts[dtype] += params[name].numel()
    return dict(counts)


def weights_delta(kept: dict[torch.dtype, int], precision: str, *, shards: int = 1) -> int:
    """Bytes the overridden weights add to the step's "parameters" line (negative: they save)."""
    param_bytes = get_numerics(precision).param_bytes
    return sum(n * (dtype.itemsize - param_bytes) for dtype, n in kept.items()) // max(1, shards)


def states_delta(kept: dict[torch.dtype, int], setting: StepSetting) -> int:
    """Bytes the overridden weights' optimizer states add (0 where the states do not follow the weights'
    dtype: 8-bit AdamW, or mixed precision, whose fp32 weights an fp32 island keeps)."""
    base = get_numerics(setting.precision).param_bytes
    opt = setting.optimizer
    delta = sum(
        optimizer_state_bytes(opt, [n], param_bytes=dtype.itemsize) - optimizer_state_bytes(opt, [n], param_bytes=base)
        for dtype, n in kept.items()
    )
    return delta // max(1, setting.shards)


def adjust_weights(ledger: Ledger, kept: dict[torch.dtype, int]) -> Ledger:
    """`ledger` with the overridden weights, their gradients and optimizer states in the weights' own
    dtype (module docstring); unchanged without any."""
    setting = ledger.setting
    weights = weights_delta(kept, setting.precision, shards=setting.shards)
    states = states_delta(kept, setting)
    if not weights and not states:
        return ledger
    at_peak, largest = dict(ledger.at_peak), dict(ledger.largest)
    alive = at_peak["gradients"] / largest["gradients"] if largest.get("gradients") else 0.0
    for line, peak_delta, full_delta in (
        ("parameters", weights, weights),
        ("optimizer_states", states, states),
        ("gradients", int(weights * alive), weights),
    ):
        at_peak[line] += peak_delta
        largest[line] = largest.get(line, 0) + full_delta
    return dataclasses.replace(ledger, at_peak=at_peak, largest=largest)


def part_precisions(overrides: ModuleOverrides, available: set[str]) -> dict[str, str]:
    """A VLM plan's overrides as part -> regime (`available`: the model's parts with parameters); a
    pattern that is not one of them is one line."""
    out = {}
    for override in overrides.items:
        if override.pattern not in PART_NAMES or override.pattern not in available:
            raise UsageError(
                f"module pattern {override.pattern!r}: a VLM's plan counts overrides by part; name one of "
                f"its parts: {', '.join(p for p in PART_NAMES if p in available)}"
            )
        out[override.pattern] = override.regime
    return out
