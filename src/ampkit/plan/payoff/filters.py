"""The filter a user pastes into torchao: the Linears predicted to pay converted, the others skipped.

`filter_fqns` is torchtitan's spelling (`[quantize.linear.float8] filter_fqns`, `[quantize.linear.mx]`:
a module whose fully qualified name contains one of them stays in bf16); `module_filter_fn(module, fqn)`
is what torchao's `convert_to_float8_training(module_filter_fn=...)` and `quantize_(filter_fn=...)` call.
Every block is alike, so a Linear kind converts in every block or in none.
"""

from __future__ import annotations

from ampkit.plan.payoff.formats import Candidate

_APPLY = {
    "fp8-e4m3": (
        "from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
        'convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("{recipe}"), '
        "module_filter_fn=module_filter_fn)",
    ),
    "mxfp8": (
        "from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig\n"
        "from torchao.quantization import quantize_",
        "quantize_(model, MXFP8TrainingOpConfig(), filter_fn=module_filter_fn)",
    ),
    "nvfp4": (
        "from torchao.prototype.moe_training.nvfp4_training.nvfp4_training import NVFP4TrainingConfig\n"
        "from torchao.quantization import quantize_",
        "quantize_(model, NVFP4TrainingConfig(), filter_fn=module_filter_fn)",
    ),
}
"""How torchao 0.18 converts a model's Linears to each format it trains in (fp8-e5m2 is fp8's)."""
_APPLY["fp8-e5m2"] = _APPLY["fp8-e4m3"]


def torchao_filter(candidate: Candidate, *, skipped: list[str], converted: list[str], where: str) -> dict:
    """The filter for `candidate` (`skipped`, `converted`: Linear names), its code, and a note where
    torchao has no training recipe for the format (MXFP4 in 0.18)."""
    lines = [
        f"# {candidate.label}: convert only the Linears predicted to pay ({where})",
        "import torch",
        "",
        f"filter_fqns = {skipped!r}",
        "",
        "def module_filter_fn(module, fqn):",
        "    return isinstance(module, torch.nn.Linear) and not any(part in fqn for part in filter_fqns)",
    ]
    apply = _APPLY.get(candidate.format)
    note = None
    if apply is None:
        note = f"torchao 0.18 has no {candidate.format} training recipe; the filter is the list of what pays"
    else:
        imports, call = apply
        lines = [lines[0], *lines[1:2], imports, *lines[2:], "", call.format(recipe=candidate.recipe)]
    return {"filter_fqns": skipped, "converted": converted, "code": "\n".join(lines), "note": note}
