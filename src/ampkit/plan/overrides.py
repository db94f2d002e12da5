"""The per-module precision overrides (`--keep-fp32`, `--module-precision`) in the plan and the fit check.

A VLM's ledger is per part (`plan/vlm/ledger.py`), each part in its own precision: an override naming
a part (vision, projector, language) becomes that part's precision (`part_precisions`), and the whole
part is counted in it (weights, gradients, optimizer states, activations; an fp32 island as fp32).

A causal LM's ledger has one storage dtype for every weight, so an override is counted in its
weights only: the overridden modules' parameters (resolved on the model built on the meta device,
as the policy resolves them) move from the step's storage dtype to the regime's, on the
"parameters" line (`adjust_weights`). Not counted there yet: their gradients and optimizer states
(same dtype as the weights under a -true precision), their activations (fp32 inside an island), and
the framework reserve over the changed peak. Units: bytes and elements.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.plan.describe import ModelDescription
from ampkit.plan.numerics import get_numerics
from ampkit.plan.setting import Ledger
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


def adjust_weights(ledger: Ledger, kept: dict[torch.dtype, int]) -> Ledger:
    """`ledger` with the overridden weights in their own dtype (module docstring); unchanged without any."""
    delta = weights_delta(kept, ledger.setting.precision, shards=ledger.setting.shards)
    if not delta:
        return ledger
    at_peak = {**ledger.at_peak, "parameters": ledger.at_peak["parameters"] + delta}
    largest = {**ledger.largest, "parameters": ledger.largest.get("parameters", 0) + delta}
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
