"""Low-bit Linears (fp8, mxfp8, mxfp4, nvfp4 and their emulations): bf16-mixed plus a format's converter.

The weights stay fp32 (master weights) and the model runs under bf16 autocast; `convert_module` hands the
model to the converter its Linears' format names (`ampkit.formats` -> `ampkit.precision.convert`), which
swaps the eligible Linears and reports which it kept in bf16 and why (`conversion()`). The policy holds
no numeric state of its own: every converter's scales are dynamic (recomputed from each tensor), so a
checkpoint's model and scaler states are all a resumed run needs.
"""

from __future__ import annotations

from torch import nn

from ampkit.precision.amp import AutocastPrecision, ScalerConfig
from ampkit.precision.convert import ConversionReport, LinearConverter, converter_class
from ampkit.precision.fp8 import Fp8Options
from ampkit.precision.overrides import ModuleOverrides
from ampkit.precision.table import PrecisionSpec


class LowBitPrecision(AutocastPrecision):
    """bf16-mixed plus low-bit matmuls in the converted Linear layers (fp32 master weights)."""

    def __init__(
        self,
        spec: PrecisionSpec,
        *,
        device_type: str,
        scaler: ScalerConfig | None = None,
        fp8: Fp8Options | None = None,
        overrides: ModuleOverrides | None = None,
    ) -> None:
        super().__init__(spec, device_type=device_type, scaler=scaler, overrides=overrides)
        self.options = fp8 or Fp8Options()
        self._report: ConversionReport | None = None

    def converter(self) -> LinearConverter:
        """The converter of this precision's format, in its native or emulated mode."""
        cls = converter_class(self.spec.linear_format)
        return cls(precision=self.spec.name, emulated=self.spec.emulated, options=self.options)

    def _convert(self, module: nn.Module) -> nn.Module:
        """Swap the eligible Linears, less those inside a per-module override (they keep its regime)."""
        kept = {path: f"kept in {o.regime} by a module override" for path, o in self.overrides.resolve(module).items()}
        self._report = self.converter().convert(module, keep=kept)
        return module

    def conversion(self) -> ConversionReport | None:
        return self._report
