"""`ampkit plan --precisions fp8 --gpu NAME`: which of the model's Linears fp8 is predicted to speed up
(the GEMM roofline, `ampkit.hardware.roofline`), the share of the Linear FLOPs converted, and the step's
predicted gain, with a warning below 1.05x (fp8's casts cost more than they save on small GEMMs).

Each decoder block's Linears for the micro-batch's tokens (M = micro_batch x seq_len); the output head
stays bf16 (ampkit never converts it); attention's score and value products stay bf16 and count as the
step's other time (12 x layers x d_model x seq_len FLOPs per token at the bf16 peak). `plan --formats`
(`plan/payoff/`) prices every format this way, with the rest of the step and the quantize kernels
shown apart.
"""

from __future__ import annotations

from typing import Any

from ampkit.hardware.roofline import BASELINE, Roofline, speedup
from ampkit.plan.describe import ModelDescription

WORTH_IT = 1.05  # below this predicted end-to-end gain, say fp8 is not worth its fidelity risk
FP8 = "fp8-e4m3"


def block_linears(desc: ModelDescription) -> list[tuple[str, int, int]] | None:
    """(name, in_features, out_features) of one decoder block's Linears; None where the family has
    none fp8 converts (GPT-2's Conv1D)."""
    if not desc.block.fp8_linears:
        return None
    return desc.block.linears(d=desc.d_model, q=desc.q_dim, kv=desc.kv_dim, ff=desc.d_ff)


def fp8_plan(desc: ModelDescription, *, micro_batch: int, seq_len: int, gpu, recipe: str = "tensorwise"):
    """The fp8 block of the plan's summary, or None when the GPU has no fp8 peak."""
    roofline = Roofline.from_gpu(gpu) if gpu is not None else None
    if roofline is None or not roofline.runs(FP8):
        return None
    linears = block_linears(desc)
    if linears is None:
        return {"recipe": recipe, "note": f"{desc.family} uses Conv1D layers: fp8 converts none of them"}
    tokens = micro_batch * seq_len
    layers = [_layer(name, tokens, k, n, roofline, recipe) for name, k, n in linears]
    attention_s = 12.0 * desc.d_model * seq_len * tokens / (roofline.peak(BASELINE) or 1.0)  # per block, bf16
    block = _block_gain(layers, other_seconds=attention_s)
    out: dict[str, Any] = {"recipe": recipe, "tokens": tokens, "layers": [_public(p) for p in layers], **block}
    if block["speedup"] < WORTH_IT:
        out["warning"] = (
            f"fp8 is predicted to gain only {block['speedup']:.2f}x here ({block['converted_layers']} of "
            f"{block['layers']} block Linears pay at {tokens} tokens a micro-batch): bf16-mixed is the better choice"
        )
    return out


def _layer(name: str, m: int, k: int, n: int, roofline: Roofline, recipe: str) -> dict[str, Any]:
    gain = speedup(m, k, n, roofline, fmt=FP8, recipe=recipe)
    return {
        "name": name,
        "m": m,
        "k": k,
        "n": n,
        "speedup": gain.with_overhead,
        "flops": 6.0 * m * k * n,  # the layer's three GEMMs
        "converted": gain.with_overhead >= 1.0,
        "bf16_s": gain.bf16.total_s,
        "fp8_s": gain.low.total_s,
    }


def _public(layer: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in layer.items() if key not in ("bf16_s", "fp8_s")}


def _block_gain(layers: list[dict[str, Any]], *, other_seconds: float) -> dict[str, Any]:
    """The block's predicted gain when the Linears predicted to pay are converted (others stay bf16);
    `other_seconds` is its time outside these Linears (attention: unchanged)."""
    bf16 = sum(p["bf16_s"] for p in layers) + other_seconds
    fp8 = sum(p["fp8_s"] if p["converted"] else p["bf16_s"] for p in layers) + other_seconds
    total_flops = sum(p["flops"] for p in layers)
    converted_flops = sum(p["flops"] for p in layers if p["converted"])
    return {
        "speedup": bf16 / fp8 if fp8 else 1.0,
        "converted_flops_share": converted_flops / total_flops if total_flops else 0.0,
        "converted_layers": sum(p["converted"] for p in layers),
        "layers": len(layers),
    }


def fp8_line(block: dict[str, Any]) -> str:
    """One line for the console."""
    if "note" in block:
        return f"fp8: {block['note']}"
    return (
        f"fp8 ({block['recipe']}): {block['converted_layers']} of {block['layers']} block Linears predicted "
        f"faster at {block['tokens']} tokens ({block['converted_flops_share']:.0%} of their FLOPs), predicted "
        f"block gain {block['speedup']:.2f}x over bf16"
    )
