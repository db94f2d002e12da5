"""fp8: torchao's float8 training conversion of the Linear layers, bf16 autocast for the rest.

Only Linear layers whose in/out features are multiples of 16 and at least `min_features` are
converted (float8 matmuls need 16-aligned shapes, and on small layers the casts cost more than they
save); the output head stays in bf16, since the logits' precision drives the loss. torchao is an
optional dependency loaded lazily (`pip install 'ampkit[fp8]'`). `fp8-emulated` runs the same
conversion with torchao's emulation (fp8 rounding in software, no speedup): for tests and CPUs.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from dataclasses import dataclass
from types import ModuleType

from torch import nn

from ampkit.errors import UsageError
from ampkit.precision.amp import AutocastPrecision, ScalerConfig
from ampkit.precision.fp8_roofline import Roofline, predicted_speedup
from ampkit.precision.table import PrecisionSpec

MIN_FEATURES = 16
SKIP_MODULES = ("lm_head",)


_QUIET_AT_IMPORT = ("torchao", "torch.utils._pytree")


def _load_torchao_float8() -> ModuleType:
    # torchao logs a warning per optional CUDA extension it cannot load at import; on a CPU build
    # that is noise. The loggers are quiet for the import only, then restored to their levels.
    loggers = [logging.getLogger(name) for name in _QUIET_AT_IMPORT]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        return importlib.import_module("torchao.float8")
    except ImportError:
        raise UsageError("fp8 needs torchao, which is not installed: pip install 'ampkit[fp8]'") from None
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def fp8_module_filter(module: nn.Module, fqn: str, *, min_features: int = MIN_FEATURES) -> bool:
    """Which Linear layers become float8: 16-aligned, not tiny, not the output head."""
    if not isinstance(module, nn.Linear) or any(fqn.endswith(s) for s in SKIP_MODULES):
        return False
    dims = (module.in_features, module.out_features)
    return all(d % 16 == 0 and d >= min_features for d in dims)


@dataclass(frozen=True, kw_only=True)
class Fp8Options:
    """How a run converts its Linears: torchao's recipe, and (on a GPU the table knows) the roofline
    that keeps in bf16 every Linear predicted not to gain (`ampkit.precision.fp8_roofline`)."""

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


class Fp8Precision(AutocastPrecision):
    """bf16-mixed plus float8 matmuls in the converted Linear layers (fp32 master weights)."""

    def __init__(
        self,
        spec: PrecisionSpec,
        *,
        device_type: str,
        scaler: ScalerConfig | None = None,
        fp8: Fp8Options | None = None,
    ) -> None:
        super().__init__(spec, device_type=device_type, scaler=scaler)
        self.options = fp8 or Fp8Options()

    def convert_module(self, module: nn.Module) -> nn.Module:
        float8 = _load_torchao_float8()
        config = dataclasses.replace(
            float8.Float8LinearConfig.from_recipe_name(self.options.recipe),
            emulate=self.spec.emulated,
            enable_fsdp_float8_all_gather=self.options.fsdp_all_gather,
        )
        options = self.options
        float8.convert_to_float8_training(
            module, config=config, module_filter_fn=lambda m, fqn: fp8_module_filter(m, fqn) and options.pays(m)
        )
        return module


def converted_layers(module: nn.Module) -> list[str]:
    """Names of the layers running float8 matmuls (for reports and tests)."""
    return [name for name, m in module.named_modules() if type(m).__name__ == "Float8Linear"]
