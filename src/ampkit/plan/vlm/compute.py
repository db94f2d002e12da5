"""A VLM step's FLOPs: the vision encoder over its patches, the projector, the language model over
text + image tokens, mllama's cross-attention over the vision states; and the step's time.

Forward FLOPs per sample (a matmul weight of N elements applied to t tokens costs 2 N t):
- vision: 2 x vision matmul parameters x encoder tokens (every pass: mllama's tile slots, Idefics3's
  tiles + global image) + attention 4 x layers x width x T_pass^2 per pass (a windowed layer,
  Qwen2.5-VL's, x T_pass x window instead);
- projector: 2 x its matmul parameters x the tokens it maps (image tokens; mllama: every vision
  state, and its fusion layers' key/value projections over them);
- language: 2 x matmul parameters (head included) x sequence tokens (text + image) + attention
  4 x self-attention layers x q_dim x T^2, PaLM's full-square convention (as `plan/analytic/compute`);
  mllama's fusion layers: 2 x their query/output/MLP parameters x T + 4 x layers x q_dim x T x C.
Training multiplies each part's forward: 3x for a part that trains (forward, input and weight
gradients), 2x for a frozen part behind a trained one (the input gradient passes through), 1x for a
frozen part with nothing trained before it (no backward at all). Full activation checkpointing runs
the forward of every part that keeps activations once more (not counted in MFU: model FLOPs only).
Units: FLOPs, FLOP/s, seconds; tokens: text and image tokens told apart.
"""

from __future__ import annotations

from typing import Any

from ampkit.hardware import GpuSpec
from ampkit.models.hf_vlm import PARTS
from ampkit.plan.analytic.compute import mfu_for
from ampkit.plan.describe.vlm import Stack, VLMDescription
from ampkit.plan.numerics import get_numerics
from ampkit.plan.vlm.workload import Workload


def _attention(stack: Stack, tokens_per_pass: int, passes: int) -> float:
    """Forward attention FLOPs of `stack` over `passes` sequences of `tokens_per_pass` tokens."""
    full = stack.layers - stack.windowed_layers
    window = min(stack.window_tokens, tokens_per_pass) if stack.windowed_layers else 0
    per_pass = 4.0 * stack.q_dim * tokens_per_pass * (full * tokens_per_pass + stack.windowed_layers * window)
    return passes * per_pass


def forward_flops(desc: VLMDescription, workload: Workload, *, seq_len: int) -> dict[str, float]:
    """Forward FLOPs of one sample, per part (module docstring)."""
    m, w = desc.matmul, workload
    passes = w.encoder_passes
    vision = 2.0 * m.vision * w.encoder_tokens
    if passes:
        vision += _attention(desc.vision, w.encoder_tokens // passes, passes)
    projector = 2.0 * m.projector_image * w.image_tokens + 2.0 * m.projector_cross * w.cross_tokens
    if desc.fusion is not None:
        projector += 2.0 * m.fusion_text * seq_len
        projector += 4.0 * desc.fusion.layers * desc.fusion.q_dim * seq_len * w.cross_tokens
    language = 2.0 * m.language * seq_len + _attention(desc.language_stack, seq_len, 1)
    return {"vision": vision if w.images else 0.0, "projector": projector, "language": language}


def training_factor(workload: Workload, part: str) -> float:
    if workload.trains(part):
        return 3.0
    return 2.0 if workload.saves(part) else 1.0


def step_flops(desc: VLMDescription, workload: Workload, *, seq_len: int, samples: int) -> dict[str, float]:
    """Training FLOPs of `samples` samples, per part (model FLOPs: no recompute)."""
    fwd = forward_flops(desc, workload, seq_len=seq_len)
    return {p: fwd[p] * training_factor(workload, p) * samples for p in PARTS}


def vlm_compute(
    desc: VLMDescription,
    workload: Workload,
    *,
    precision: str,
    seq_len: int,
    samples: int,
    gpu: GpuSpec | None,
    mfu: float,
    checkpointing: bool,
) -> dict[str, Any]:
    """One optimizer step's FLOPs (per part and in all), its tokens (text and image) and time on `gpu`.
    The fields of `plan/analytic/compute.StepCompute`, per processed token, plus the breakdown."""
    parts = step_flops(desc, workload, seq_len=seq_len, samples=samples)
    flops = sum(parts.values())
    fwd = forward_flops(desc, workload, seq_len=seq_len)
    recompute = sum(fwd[p] for p in PARTS if workload.saves(p)) * samples if checkpointing else 0.0
    image_tokens = workload.image_tokens * samples
    tokens = seq_len * samples
    num = get_numerics(precision)
    peak = gpu.peak_flops(num.peak_key) if gpu is not None else None
    at_peak = (flops + recompute) / peak if peak else None
    mfu, mfu_source, mfu_note = mfu_for(gpu, num.peak_key, given=mfu)  # mfu 0: the achievable-MFU table
    at_mfu = flops / (peak * mfu) if peak else None
    return {
        "precision": num.name,
        "peak_key": num.peak_key,
        "flops_per_token": flops / tokens if tokens else 0.0,
        "tokens_per_step": tokens,
        "text_tokens_per_step": tokens - image_tokens,
        "image_tokens_per_step": image_tokens,
        "images_per_step": workload.images * samples,
        "flops_per_step": flops,
        "flops_by_part": parts,
        "recompute_flops": recompute,
        "peak_flops": peak,
        "step_s_at_peak": at_peak,
        "step_s_at_mfu": at_mfu,
        "tokens_per_s": tokens / at_mfu if at_mfu else None,
        "text_tokens_per_s": (tokens - image_tokens) / at_mfu if at_mfu else None,
        "hours_per_billion_tokens": 1e9 / (tokens / at_mfu) / 3600 if at_mfu else None,
        "mfu": mfu,
        "mfu_source": mfu_source,
        "mfu_note": mfu_note if peak else None,
    }
