"""The per-layer what-if ledger: what each Linear's GEMM inputs would lose in each numeric format.

From one fp32 run of a few batches (forward and backward through the step's own forward-and-loss,
`core.policy_loss`, and the policy's backward; no optimizer step), each `nn.Linear`'s three GEMM inputs
are rounded to every format (`whatif_qdq.py`) and compared with themselves:
    weight        the layer's weight (once: no step changes it)
    input         the activations it is fed (every batch)
    grad_output   the gradient arriving at its output (every batch), seen by a tensor hook on the
                  output (`grad_hooks.hook_outputs`: safe with models that modify outputs in place)
Per (Linear, format, tensor): the relative error ||q(x) - x|| / ||x|| over every element of every
batch, the share of its nonzero elements flushed to zero, the share saturated (clamped at its scale's
largest value), and its dynamic range (log2 of max |x| over the smallest nonzero |x|, in binades) beside
the format's (an element's: for block formats, what one block holds; the mean range inside a block is
given for them too).

Which Linears stay in bf16, per low-bit format (8 bits or fewer), and why:
    the head      the model's last Linear (the output projection): kept in bf16 by every converter ampkit
                  drives and by NVIDIA's NVFP4 recipe; the embeddings are no Linear and stay as they are
    outliers      a layer whose worst tensor error is over `OUTLIER_FACTOR` x the format's median layer
                  (saturation is reported, not a criterion of its own: MXFP4's floor scales and NVFP4's
                  rounded e4m3 scales clamp a block's largest values in every layer alike; what it costs
                  is in the error)
    the 4-bit share  for the 4-bit formats, at least the `KEEP_SHARE_4BIT` of the other Linears with the
                  largest error (NVIDIA, "Pretraining LLMs with NVFP4", arXiv 2509.25149: ~15% of the linear layers
                  kept in BF16, mostly the last ones, where the quantization error of the weight gradients
                  was largest; the paper suggests such error metrics to pick them)
bf16 and fp16 are whole-model precisions: listed for their errors, flush and range (fp16's gradients
flush without a loss scale: fp16-mixed's GradScaler is that fix), with no per-layer list.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ampkit.core import policy_loss
from ampkit.diagnostics.grad_hooks import hook_outputs
from ampkit.diagnostics.whatif_qdq import WHAT_IF_FORMATS, Rounded, element_range_binades, quantize_dequantize
from ampkit.formats import get_format

TENSORS = ("weight", "input", "grad_output")
OUTLIER_FACTOR = 2.0
KEEP_SHARE_4BIT = 0.15
LOW_BIT = 8
"""formats of this many bits or fewer convert Linear by Linear (a keep-in-bf16 list); wider ones are whole-model"""


@dataclass
class _TensorSums:
    """What a (Linear, tensor) is, whatever the format: its size, norm, range and in-block ranges,
    summed over every batch."""

    sq_ref: float = 0.0
    numel: int = 0
    nonzero: int = 0
    amax: float = 0.0
    amin: float = math.inf
    """smallest nonzero magnitude"""
    block_range: dict[int, list[float]] = field(default_factory=dict)
    """block size -> [sum of the blocks' ranges in binades, blocks counted]"""

    def add(self, x: torch.Tensor, blocks: Iterable[int]) -> torch.Tensor:
        """Add `x` (fp32); returns its nonzero mask, which the formats' sums reuse."""
        nonzero = x != 0
        magnitude = x.abs()
        self.sq_ref += float(torch.dot(x.flatten(), x.flatten()))  # fp32 BLAS sum (~1e-6 relative): a ratio's parts
        self.numel += x.numel()
        count = int(nonzero.sum())
        self.nonzero += count
        if count:
            self.amax = max(self.amax, float(magnitude.max()))
            self.amin = min(self.amin, float(magnitude[nonzero].min()))
        for block in blocks:
            total, counted = self.block_range.setdefault(block, [0.0, 0])
            more, n = _block_ranges(magnitude, block)
            self.block_range[block] = [total + more, counted + n]
        return nonzero

    def range_binades(self) -> float:
        return math.log2(self.amax / self.amin) if self.nonzero else 0.0


def _block_ranges(magnitude: torch.Tensor, block: int) -> tuple[float, int]:
    """The summed range inside each block along the last dimension (log2 of its max over its smallest
    nonzero; all-zero blocks skipped), and how many blocks that is."""
    pad = (-magnitude.shape[-1]) % block
    blocks = torch.nn.functional.pad(magnitude, (0, pad)).reshape(-1, block)
    top = blocks.amax(dim=-1)
    low = torch.where(blocks > 0, blocks, math.inf).amin(dim=-1)
    keep = top > 0
    return float(torch.log2(top[keep] / low[keep]).sum()), int(keep.sum())


@dataclass
class _Sums:
    """One (Linear, format, tensor) cell's rounding, summed over every batch."""

    sq_err: float = 0.0
    flushed: int = 0
    saturated: int = 0

    def add(self, x: torch.Tensor, nonzero: torch.Tensor, rounded: Rounded) -> None:
        diff = (rounded.values - x).flatten()
        self.sq_err += float(torch.dot(diff, diff))
        self.flushed += int((nonzero & (rounded.values == 0)).sum())
        self.saturated += int(rounded.saturated.sum())

    def to_dict(self, tensor: _TensorSums, block: int) -> dict[str, Any]:
        blocks = tensor.block_range.get(block)
        return {
            "rel_error": math.sqrt(self.sq_err / tensor.sq_ref) if tensor.sq_ref else 0.0,
            "flushed": self.flushed / tensor.nonzero if tensor.nonzero else 0.0,
            "saturated": self.saturated / tensor.numel if tensor.numel else 0.0,
            "range_binades": tensor.range_binades(),
            "block_range_binades": blocks[0] / blocks[1] if blocks and blocks[1] else None,
            "numel": tensor.numel,
        }


@dataclass
class _Layer:
    name: str
    in_features: int
    out_features: int
    tensors: dict[str, _TensorSums] = field(default_factory=dict)
    cells: dict[tuple[str, str], _Sums] = field(default_factory=dict)
    """(format, tensor) -> sums"""


class WhatIfRecorder:
    """Hooks on every `nn.Linear` that round its weight, input and output gradient to each format.
    `attach()` before the forward, `detach()` after the last backward (hooks are removed even on error)."""

    def __init__(self, model: nn.Module, formats: Iterable[str] = WHAT_IF_FORMATS):
        self.formats = tuple(get_format(f).name for f in formats)
        self.modules = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
        self.layers = {name: _Layer(name, m.in_features, m.out_features) for name, m in self.modules}
        self._handles: list[Any] = []
        self._weights_done: set[str] = set()
        self._blocks = sorted({get_format(f).block for f in self.formats} - {1})

    def record(self, name: str, tensor: str, x: torch.Tensor) -> None:
        """Round `x` (the `tensor` of Linear `name`) to every format and add it to the sums."""
        layer = self.layers[name]
        with torch.no_grad():
            flat = x.detach().float().reshape(-1, x.shape[-1]) if x.dim() > 1 else x.detach().float().reshape(1, -1)
            nonzero = layer.tensors.setdefault(tensor, _TensorSums()).add(flat, self._blocks)
            for fmt in self.formats:
                layer.cells.setdefault((fmt, tensor), _Sums()).add(flat, nonzero, quantize_dequantize(flat, fmt))

    def attach(self) -> WhatIfRecorder:
        for name, module in self.modules:
            self._handles.append(module.register_forward_hook(self._forward_hook(name)))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _forward_hook(self, name: str):
        def hook(module: nn.Linear, args: tuple, output: Any) -> None:
            if name not in self._weights_done:
                self.record(name, "weight", module.weight)
                self._weights_done.add(name)
            if args and isinstance(args[0], torch.Tensor):
                self.record(name, "input", args[0])
            hook_outputs(output, lambda grad: self.record(name, "grad_output", grad))

        return hook


def run_what_if(
    model: nn.Module, batches: Iterable[Any], *, policy, loss_fn, formats: Iterable[str] = WHAT_IF_FORMATS
) -> dict[str, Any]:
    """The ledger of `model` (fp32 weights) over `batches` (each on the model's device): forward and
    loss through `core.policy_loss`, backward through `policy.backward`; gradients cleared after each."""
    recorder = WhatIfRecorder(model, formats).attach()
    count = 0
    try:
        with policy.run_context():
            for batch in batches:
                loss, _ = policy_loss(policy, loss_fn, model, batch)
                policy.backward(loss)
                model.zero_grad(set_to_none=True)
                count += 1
    finally:
        recorder.detach()
    return ledger_dict(recorder, batches=count)


def ledger_dict(recorder: WhatIfRecorder, *, batches: int) -> dict[str, Any]:
    """summary.json's `what_if` block: the cells per Linear, the ranges, and which stay bf16 per format."""
    layers: list[dict[str, Any]] = []
    for layer in recorder.layers.values():
        formats = {}
        for fmt in recorder.formats:
            block = get_format(fmt).block
            cells = {
                t: layer.cells[(fmt, t)].to_dict(layer.tensors[t], block) for t in TENSORS if (fmt, t) in layer.cells
            }
            formats[fmt] = {**cells, "score": max((c["rel_error"] for c in cells.values()), default=0.0)}
        layers.append(
            {
                "name": layer.name,
                "in_features": layer.in_features,
                "out_features": layer.out_features,
                "formats": formats,
            }
        )
    head: str | None = str(layers[-1]["name"]) if layers else None  # the model's last Linear: its output
    return {
        "batches": batches,
        "reference": "fp32",
        "formats": list(recorder.formats),
        "format_range_binades": {f: element_range_binades(f) for f in recorder.formats},
        "tensors": list(TENSORS),
        "head": head,
        "layers": layers,
        "keep_bf16": {f: keep_in_bf16(layers, f, head=head) for f in recorder.formats if _per_layer(f)},
        "notes": _notes(layers, recorder.formats),
    }


def _per_layer(fmt: str) -> bool:
    return get_format(fmt).bits <= LOW_BIT


def keep_in_bf16(layers: list[dict[str, Any]], fmt: str, *, head: str | None) -> list[dict[str, str]]:
    """The Linears that stay in bf16 under `fmt`, each with why (module docstring), in model order."""
    scores = {layer["name"]: layer["formats"][fmt]["score"] for layer in layers}
    median = statistics.median(scores.values()) if scores else 0.0
    why: dict[str, str] = {}
    if head is not None:
        why[head] = "the output head"
    for layer in layers:
        name = layer["name"]
        if name not in why and median and scores[name] > OUTLIER_FACTOR * median:
            why[name] = f"error {scores[name]:.3g}, {scores[name] / median:.1f}x the median layer's"
    if get_format(fmt).bits <= 4:  # the share is of the Linears besides the head, which stays anyway
        body = [n for n in scores if n != head]
        ranked = sorted(body, key=lambda n: (scores[n], _order(layers, n)), reverse=True)
        for name in ranked[: math.ceil(KEEP_SHARE_4BIT * len(body))]:
            why.setdefault(name, f"among the {KEEP_SHARE_4BIT:.0%} largest errors ({scores[name]:.3g})")
    order = {layer["name"]: i for i, layer in enumerate(layers)}
    return [{"layer": name, "why": text} for name, text in sorted(why.items(), key=lambda item: order[item[0]])]


def _order(layers: list[dict[str, Any]], name: str) -> int:
    """A layer's place in the model (ties in error go to the later layer: the NVFP4 finding)."""
    return next(i for i, layer in enumerate(layers) if layer["name"] == name)


def _notes(layers: list[dict[str, Any]], formats: tuple[str, ...]) -> list[str]:
    notes = ["the embeddings are no Linear: no converter touches them (they stay in their dtype)"]
    if "fp16" in formats and layers:
        flushed = max(layer["formats"]["fp16"].get("grad_output", {}).get("flushed", 0.0) for layer in layers)
        if flushed > 0:
            notes.append(
                f"fp16 would flush up to {flushed:.2%} of a layer's output gradients to zero without a loss "
                "scale: fp16-mixed's GradScaler keeps them"
            )
    return notes
