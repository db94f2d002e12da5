"""Per-layer fidelity: the same weights and batch in fp32 and in the chosen precision, block by block.

Each watched module's output (the embedding, every block, the final norm, the logits) is compared
with its fp32 twin by cosine similarity and relative error ||low - ref|| / ||ref||, both computed in
fp64. The first block below 0.99 is where low precision starts to lose the signal; the seeds'
logits check passes at >= 0.99 and calls for a hunt below 0.9.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ampkit.core import forward_loss, policy_loss
from ampkit.precision import REFERENCE, Precision, build_precision
from ampkit.records import Record

GOOD_COSINE = 0.99
"""At or above: the precision keeps the layer's signal (the seeds' threshold for logits)."""
BAD_COSINE = 0.9
"""Below: an op's low-precision error is being amplified; find the layer."""


@dataclass(frozen=True, kw_only=True)
class LayerFidelity(Record):
    name: str
    cosine: float
    rel_error: float


@dataclass(frozen=True, kw_only=True)
class FidelityResult:
    precision: str
    layers: list[LayerFidelity]
    logits_cosine: float
    first_below: str | None
    """the first watched module whose cosine falls below `threshold` (None: all pass)"""
    threshold: float

    @property
    def verdict(self) -> str:
        if self.logits_cosine >= GOOD_COSINE:
            return "good"
        return "degraded" if self.logits_cosine >= BAD_COSINE else "bad"

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "layers": [layer.to_dict() for layer in self.layers],
            "logits_cosine": self.logits_cosine,
            "first_below": self.first_below,
            "threshold": self.threshold,
            "verdict": self.verdict,
        }


def watched_modules(model: nn.Module, blocks: list[nn.Module] | None = None) -> list[str]:
    """Paths compared: the embedding, each repeated block (the task's, by identity: an adapter's blocks
    may live at another path, hf.model.layers.N) and the final norm, when the model has them; a model
    with no blocks is compared at its top-level children. The outputs are always compared ("logits")."""
    names = dict(model.named_modules())
    if blocks is None:
        found = getattr(model, "blocks", None)
        blocks = list(found) if found is not None else []
    if not blocks:
        return [name for name, _ in model.named_children()]
    path_of = {id(m): name for name, m in names.items()}
    paths = [p for p in ("embed",) if p in names] + [path_of[id(block)] for block in blocks]
    return paths + [p for p in ("norm",) if p in names]


def _capture(model: nn.Module, policy: Precision, batch, paths: list[str], loss_fn) -> dict[str, torch.Tensor]:
    modules = dict(model.named_modules())
    outputs: dict[str, torch.Tensor] = {}

    def keep(path):
        def hook(module, args, output):
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            outputs[path] = tensor.detach().double()

        return hook

    handles = [modules[p].register_forward_hook(keep(p)) for p in paths]
    was_training = model.training
    try:
        with torch.no_grad(), policy.run_context():
            model.eval()
            _, logits = policy_loss(policy, loss_fn, model, batch)  # the task's forward-and-loss; the loss is unused
            outputs["logits"] = logits.detach().double()
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return outputs


def _compare(ref: torch.Tensor, low: torch.Tensor) -> tuple[float, float]:
    a, b = ref.flatten(), low.flatten()
    if not torch.isfinite(b).all():
        return math.nan, math.inf
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=0, eps=1e-30).item()
    rel = ((a - b).norm() / a.norm().clamp_min(1e-30)).item()
    return cosine, rel


def compare_layers(
    model: nn.Module,
    batch,
    *,
    precision: str | Precision,
    device_type: str,
    threshold: float = GOOD_COSINE,
    loss_fn=forward_loss,
    blocks: list[nn.Module] | None = None,
) -> FidelityResult:
    """Run `model` (fp32 weights; left untouched) in fp32 and, on a converted copy, in `precision`;
    `loss_fn` is the task's (`task.loss`), `blocks` its repeated blocks."""
    policy = precision if isinstance(precision, Precision) else build_precision(precision, device_type=device_type)
    reference = build_precision(REFERENCE, device_type=device_type)
    paths = watched_modules(model, blocks)
    ref = _capture(model, reference, batch, paths, loss_fn)
    low_model = policy.convert_module(copy.deepcopy(model))
    low = _capture(low_model, policy, batch, paths, loss_fn)
    layers = [
        LayerFidelity(name=p, cosine=c, rel_error=r) for p in [*paths, "logits"] for c, r in [_compare(ref[p], low[p])]
    ]
    first = next((layer.name for layer in layers if not layer.cosine >= threshold), None)  # nan counts as below
    return FidelityResult(
        precision=policy.name, layers=layers, logits_cosine=layers[-1].cosine, first_below=first, threshold=threshold
    )
