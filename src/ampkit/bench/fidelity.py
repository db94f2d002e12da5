"""Fidelity against fp32: the same weights, the same batch, how far does a precision drift?

The worker captures, at the *initial* weights (identical in every precision: same seed) and on one
fixed held-out batch: the logits at real (non-padding) positions, the loss, and the gradient vector.
The parent compares each precision's capture with fp32's:
- cosine similarity of the logits (the seeds' rule: >= 0.99 healthy, < 0.9 a layer's error is being
  amplified) and their max absolute difference,
- the loss difference and the cosine similarity of the gradient vectors (of the trainable parameters:
  under `--lora`, the adapters' gradients),
- and, over the training steps both ran, the gap between the loss curves.
Cosines are computed in float64 and written so that a vector compared with itself gives exactly 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ampkit.core.step import StepPolicy, policy_loss
from ampkit.errors import UsageError
from ampkit.tasks import optional
from ampkit.tasks.lm import LMObjective

if TYPE_CHECKING:
    from ampkit.tasks import Task

HEALTHY_COSINE = 0.99
AMPLIFIED_COSINE = 0.9
MAX_GRAD_ELEMENTS = 16_000_000  # ~64 MB as fp32 on disk; larger gradients are compared on a fixed stride
FIDELITY_ROWS = 4  # rows of the fixed batch used for the capture (bounds the logits file)


def capture_fidelity(
    *, model: torch.nn.Module, policy: StepPolicy, batch: Any, task: Task | LMObjective | None = None
) -> dict:
    """Forward + loss + backward on `batch` at the model's current weights; nothing is stepped.

    `task` gives the loss and the outputs compared (default: the language model's logits at real
    positions). Backward goes through the policy (`policy.backward`: under fp16-mixed the loss is
    multiplied by the scaler's current scale, exactly as in training, so fp16 gradients do not
    underflow) and the scale is divided back out in fp32. The scaler's state is not touched (no
    unscale, no step, no update). Gradients are cleared afterwards.
    Precondition: `batch` is on the model's device; call before any optimizer step.
    """
    task = task or LMObjective()
    model.train()
    loss, outputs = policy_loss(policy, task.loss, model, batch)
    scale = policy.loss_scale() or 1.0
    policy.backward(loss)
    params = [p for p in model.parameters() if p.requires_grad]
    grad = torch.cat([_flat_grad(p) for p in params]).div_(scale)
    model.zero_grad(set_to_none=True)
    return {
        # (rows, features) fp32. optional.* finds the task's methods by getattr, so LMObjective (the
        # batch half of a Task, not a whole one) serves: hence the ignore
        "logits": optional.fidelity_outputs(task, outputs, batch).float().cpu(),  # type: ignore[arg-type]
        "loss": float(loss.detach().float().item()),
        "grad": _subsample(grad).cpu(),
        "grad_numel": int(grad.numel()),
    }


def _flat_grad(param: torch.nn.Parameter) -> torch.Tensor:
    if param.grad is None:
        return torch.zeros(param.numel(), device=param.device, dtype=torch.float32)  # numel: global under FSDP2
    grad = param.grad.detach()
    gather = getattr(grad, "full_tensor", None)  # FSDP2's sharded gradient (a DTensor): gathered whole, a
    if gather is not None:  # collective every rank runs (each captures); DDP's is whole and already averaged
        grad = gather()
    return grad.float().reshape(-1)


def _subsample(grad: torch.Tensor) -> torch.Tensor:
    """The whole vector up to MAX_GRAD_ELEMENTS, else every k-th element (the same ones in every precision)."""
    if grad.numel() <= MAX_GRAD_ELEMENTS:
        return grad
    stride = math.ceil(grad.numel() / MAX_GRAD_ELEMENTS)
    return grad[::stride].clone()


def fidelity_file(path: str, rows: int, main_rows: int) -> str:
    """The capture file for `rows` rows: `path` itself for the main capture, else beside it
    (`fp32.fidelity-1row.pt`: fp32's 1-row capture, for a precision that could only afford 1 row)."""
    return path if rows == main_rows else path.replace(".fidelity.pt", f".fidelity-{rows}row.pt")


def fixed_batch(val_batches: list, *, rows: int = FIDELITY_ROWS) -> Any:
    """The capture batch: the first held-out batch, cut to `rows` rows (same in every precision)."""
    if not val_batches:
        raise UsageError("the task holds out no batch for the fidelity check; give it held-out data")
    return optional.head(val_batches[0], rows)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity in float64; exactly 1.0 for a vector with itself (dot / sqrt(|a|^2 |b|^2))."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot = float(torch.dot(a64, b64))
    norms = float(torch.dot(a64, a64)) * float(torch.dot(b64, b64))
    if norms == 0.0 or not math.isfinite(norms) or not math.isfinite(dot):
        return math.nan
    return max(-1.0, min(1.0, dot / math.sqrt(norms)))


def verdict(logits_cosine: float) -> str:
    """The seeds' reading of a logits cosine: healthy, degraded, or amplified (or non-finite)."""
    if not math.isfinite(logits_cosine):
        return "non-finite"
    if logits_cosine >= HEALTHY_COSINE:
        return "healthy"
    if logits_cosine >= AMPLIFIED_COSINE:
        return "degraded"
    return "amplified"


@dataclass(frozen=True, kw_only=True)
class Fidelity:
    """One precision against fp32 on identical weights and batch."""

    logits_cosine: float
    logits_max_abs_diff: float
    loss: float
    loss_diff: float
    """this precision's loss minus fp32's on the fixed batch"""
    grad_cosine: float
    grad_elements: int
    """gradient elements compared (all of them unless the model exceeds MAX_GRAD_ELEMENTS)"""
    verdict: str
    passed: bool
    """logits cosine >= the bench's fidelity threshold"""

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def compare_fidelity(reference: dict, other: dict, *, threshold: float = HEALTHY_COSINE) -> Fidelity:
    """Compare two captures (dicts from `capture_fidelity`); `reference` is fp32's."""
    if reference["logits"].shape != other["logits"].shape or reference["grad"].shape != other["grad"].shape:
        raise ValueError("fidelity captures differ in shape: they were not made on the same model and batch")
    logits_cos = cosine(reference["logits"], other["logits"])
    max_diff = float((reference["logits"].double() - other["logits"].double()).abs().max())
    return Fidelity(
        logits_cosine=logits_cos,
        logits_max_abs_diff=max_diff,
        loss=other["loss"],
        loss_diff=other["loss"] - reference["loss"],
        grad_cosine=cosine(reference["grad"], other["grad"]),
        grad_elements=int(other["grad"].numel()),
        verdict=verdict(logits_cos),
        passed=math.isfinite(logits_cos) and logits_cos >= threshold,
    )


def loss_curve_gap(reference: list[float], other: list[float]) -> dict:
    """Gap between two per-step loss curves over the steps both ran (same batches step for step)."""
    n = min(len(reference), len(other))
    gaps = [abs(a - b) for a, b in zip(reference[:n], other[:n])]
    if not gaps:
        return {"steps_compared": 0, "max_gap": None, "mean_gap": None, "final_gap": None}
    return {
        "steps_compared": n,
        "max_gap": math.nan if any(math.isnan(g) for g in gaps) else max(gaps),
        "mean_gap": sum(gaps) / n,
        "final_gap": other[n - 1] - reference[n - 1],
    }
