"""`ampkit plan --precisions fp8 --gpu NAME`: which of the model's Linears fp8 is predicted to speed up
(`ampkit.precision.fp8_roofline`), the share of the Linear FLOPs converted, and the step's predicted
gain, with a warning below 1.05x (fp8's casts cost more than they save on small GEMMs).

Each decoder block's Linears for the micro-batch's tokens (M = micro_batch x seq_len); the output head
stays bf16 (ampkit never converts it); attention's score and value products stay bf16 and count as the
step's other time (12 x layers x d_model x seq_len FLOPs per token at the bf16 peak).
"""

from __future__ import annotations

from typing import Any

from ampkit.plan.describe import ModelDescription
from ampkit.precision.fp8_roofline import Roofline, end_to_end, predict_layers

WORTH_IT = 1.05  # below this predicted end-to-end gain, say fp8 is not worth its fidelity risk


def block_linears(desc: ModelDescription) -> list[tuple[str, int, int]] | None:
    """(name, in_features, out_features) of one decoder block's Linears; None where the family has
    none fp8 converts (GPT-2's Conv1D)."""
    if not desc.block.fp8_linears:
        return None
    return desc.block.linears(d=desc.d_model, q=desc.q_dim, kv=desc.kv_dim, ff=desc.d_ff)


def fp8_plan(desc: ModelDescription, *, micro_batch: int, seq_len: int, gpu, recipe: str = "tensorwise"):
    """The fp8 block of the plan's summary, or None when the GPU has no fp8 peak."""
    roofline = Roofline.from_gpu(gpu) if gpu is not None else None
    if roofline is None:
        return None
    linears = block_linears(desc)
    if linears is None:
        return {"recipe": recipe, "note": f"{desc.family} uses Conv1D layers: fp8 converts none of them"}
    tokens = micro_batch * seq_len
    layers = predict_layers(linears, tokens=tokens, device=roofline, recipe=recipe)
    attention_s = 12.0 * desc.d_model * seq_len * tokens / roofline.bf16_flops  # per block, bf16
    block = end_to_end(layers, other_seconds=attention_s)
    out: dict[str, Any] = {"recipe": recipe, "tokens": tokens, "layers": [p.to_dict() for p in layers], **block}
    if block["speedup"] < WORTH_IT:
        out["warning"] = (
            f"fp8 is predicted to gain only {block['speedup']:.2f}x here ({block['converted_layers']} of "
            f"{block['layers']} block Linears pay at {tokens} tokens a micro-batch): bf16-mixed is the better choice"
        )
    return out


def fp8_line(block: dict[str, Any]) -> str:
    """One line for the console."""
    if "note" in block:
        return f"fp8: {block['note']}"
    return (
        f"fp8 ({block['recipe']}): {block['converted_layers']} of {block['layers']} block Linears predicted "
        f"faster at {block['tokens']} tokens ({block['converted_flops_share']:.0%} of their FLOPs), predicted "
        f"block gain {block['speedup']:.2f}x over bf16"
    )
