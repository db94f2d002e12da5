"""`ampkit plan --formats`: the payoff predictor. Which numeric formats pay on this model's shapes, on
which GPUs, and which Linears to convert, before a GPU hour is spent.

- `shapes.py`: the model's Linears and the forward, dgrad and wgrad GEMM of each for M tokens;
- `other.py`: the step outside those GEMMs (attention, elementwise, loss, optimizer): Amdahl's serial part;
- `formats.py`: `--formats`'s candidates (a format and its recipe);
- `predict.py`: per GPU and format, each Linear's speedup over bf16 (kernel-only and with its quantize
  kernels, priced by `ampkit.hardware.roofline`), what converts, the whole step;
- `filters.py`: the torchao filter (`filter_fqns`, `module_filter_fn`) that converts just those;
- `measure.py`: `--measure`, the same GEMMs timed where a CUDA GPU is present.
"""

from __future__ import annotations

from typing import Any

from ampkit.hardware import GPUS, GpuSpec
from ampkit.plan.describe import ModelDescription
from ampkit.plan.payoff.formats import ALL, Candidate, all_candidates, parse_formats
from ampkit.plan.payoff.predict import Workload, predict_gpu

ASSUMPTIONS = (
    "every kernel at the GPU table's dense peak or bandwidth (real GEMMs reach less, small ones least): "
    "ratios of such times, not times to plan a budget with",
    "quantize kernels unfused: each reads its operand in bf16 and writes the format, once per layout its GEMMs need",
    "every block alike; the output head, attention's score and value products, norms and the optimizer stay bf16",
    "no data-parallel communication, launch overhead or torch.compile fusion counted",
)

__all__ = ["ALL", "ASSUMPTIONS", "Candidate", "all_candidates", "parse_formats", "payoff_plan"]


def payoff_plan(
    desc: ModelDescription,
    *,
    formats: str,
    micro_batch: int,
    seq_len: int,
    grad_accum: int = 1,
    shards: int = 1,
    gpu: GpuSpec | None = None,
) -> dict[str, Any]:
    """The summary's `formats` block: every candidate on `gpu` (None: every GPU of the table)."""
    candidates = parse_formats(formats)
    work = Workload(desc=desc, micro_batch=micro_batch, seq_len=seq_len, grad_accum=grad_accum, shards=shards)
    linears = work.linears()
    out: dict[str, Any] = {
        "tokens": work.tokens,
        "micro_batch": micro_batch,
        "seq_len": seq_len,
        "grad_accum": grad_accum,
        "shards": shards,
        "candidates": [c.to_dict() for c in candidates],
        "assumptions": list(ASSUMPTIONS),
        "linears": [s.to_dict(work.tokens) for s in linears],
        "gpus": [],
        "skipped_gpus": [],
        "note": None,
        "measured": None,
    }
    if not linears:
        out["note"] = f"{desc.family} blocks hold no Linear a converter swaps (Conv1D): nothing to predict"
        return out
    gpus = [gpu] if gpu is not None else list(GPUS.values())
    predictions = {g.name: predict_gpu(work, g, candidates) for g in gpus}
    out["gpus"] = [p.to_dict() for p in predictions.values() if p is not None]
    out["skipped_gpus"] = [name for name, p in predictions.items() if p is None]  # no bf16 peak to compare with
    return out
