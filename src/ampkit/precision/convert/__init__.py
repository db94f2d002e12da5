"""Module converters, one class per low-bit format, named by the format registry (`ampkit.formats`:
`NumericFormat.converter`): fp8 (torchao float8), MXFP8 (torchao's MX training matmul), MXFP4 and
NVFP4 (torchao's NVFP4 training matmul; quantize-dequantize emulation for both). docs/formats.md
describes each."""

from __future__ import annotations

from ampkit.formats import NumericFormat
from ampkit.precision.convert.base import SKIP_MODULES, LinearConverter, guard_inplace
from ampkit.precision.convert.float8 import Float8Converter
from ampkit.precision.convert.mx import MXFP4Converter, MXFP8Converter
from ampkit.precision.convert.nvfp4 import NVFP4Converter
from ampkit.precision.convert.qdq import quantize_dequantize
from ampkit.precision.convert.report import ConversionRefused, ConversionReport

CONVERTERS: dict[str, type[LinearConverter]] = {
    cls.__name__: cls for cls in (Float8Converter, MXFP8Converter, MXFP4Converter, NVFP4Converter)
}
"""class name (as `NumericFormat.converter` spells it) -> the converter class"""

__all__ = [
    "CONVERTERS",
    "SKIP_MODULES",
    "ConversionRefused",
    "ConversionReport",
    "LinearConverter",
    "converter_class",
    "guard_inplace",
    "quantize_dequantize",
]


def converter_class(fmt: NumericFormat) -> type[LinearConverter]:
    """The converter the registry names for `fmt` (a format without one is a programming error)."""
    if fmt.converter not in CONVERTERS:
        raise KeyError(f"{fmt.name} names no converter of ampkit.precision.convert ({fmt.converter!r})")
    return CONVERTERS[fmt.converter]
