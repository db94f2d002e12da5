"""fp8's options: torchao's float8 recipe and the roofline filter (`convert/float8.py` converts).

Only Linear layers whose in/out features are multiples of 16 are converted (float8 matmuls need
16-aligned shapes), not the output head (the logits' precision drives the loss), and on a GPU the fp8
roofline knows, only those predicted to gain (on small layers the casts cost more than they save).
torchao is an optional dependency loaded lazily (`pip install 'ampkit[fp8]'`). `fp8-emulated` runs the
same conversion with torchao's emulation (fp8 rounding in software, no speedup): for tests and CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ampkit.precision.fp8_roofline import Roofline, predicted_speedup


@dataclass(frozen=True, kw_only=True)
class Fp8Options:
    """How a run converts its Linears to fp8: torchao's recipe, and (on a GPU the table knows) the
    roofline that keeps in bf16 every Linear predicted not to gain (`ampkit.precision.fp8_roofline`).
    The block-scaled formats' converters take none of these (their payoff is `ampkit plan --formats`')."""

    recipe: str = "tensorwise"
    tokens: int = 0
    """rows each Linear is fed per micro-batch (batch x sequence for a language model); 0: unknown"""
    roofline: Roofline | None = None
    """the device's peaks and bandwidth; None (CPU, emulation, an unknown GPU): no roofline filter"""
    fsdp_all_gather: bool = False
    """under FSDP2, all-gather the weights in float8 (torchao's enable_fsdp_float8_all_gather)"""

    def pays(self, module: nn.Module) -> bool:
        """Whether converting this Linear is predicted to gain (always, without a roofline)."""
        if self.roofline is None or not self.tokens or not isinstance(module, nn.Linear):
            return True
        k, n = module.in_features, module.out_features
        return predicted_speedup(self.tokens, k, n, self.roofline, recipe=self.recipe) >= 1.0


def converted_layers(module: nn.Module) -> list[str]:
    """Names of the layers running float8 matmuls (for reports and tests)."""
    return [name for name, m in module.named_modules() if type(m).__name__ == "Float8Linear"]
