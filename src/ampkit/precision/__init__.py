"""Precision policies: one closed vocabulary, one object per regime, a device check before any model is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampkit.errors import UsageError
from ampkit.hardware.capabilities import REQUIREMENTS, absence_note
from ampkit.precision.amp import AutocastPrecision, LossScaleCollapse, ScalerConfig, TruePrecision
from ampkit.precision.base import LOSS_ONLY, Precision, cast_floating
from ampkit.precision.convert import ConversionRefused, ConversionReport, converter_class
from ampkit.precision.fp8 import Fp8Options
from ampkit.precision.lowbit import LowBitPrecision
from ampkit.precision.overrides import REGIMES, ModuleOverride, ModuleOverrides
from ampkit.precision.table import (
    ALIASES,
    REFERENCE,
    SPECS,
    PrecisionSpec,
    canonical_name,
    get_spec,
    precision_names_help,
)

if TYPE_CHECKING:
    from ampkit.hardware.device import DeviceInfo

__all__ = [
    "ALIASES",
    "LOSS_ONLY",
    "REFERENCE",
    "REGIMES",
    "SPECS",
    "AutocastPrecision",
    "ConversionRefused",
    "ConversionReport",
    "Fp8Options",
    "LossScaleCollapse",
    "LowBitPrecision",
    "ModuleOverride",
    "ModuleOverrides",
    "Precision",
    "PrecisionSpec",
    "ScalerConfig",
    "TruePrecision",
    "build_precision",
    "canonical_name",
    "cast_floating",
    "check_supported",
    "get_spec",
    "precision_names_help",
]


def check_supported(name: str, info: DeviceInfo) -> list[str]:
    """Refuse a precision this device cannot run (UsageError with the fix); return warnings for
    precisions it runs only by emulation. `info` is a `hardware.DeviceInfo` of any kind (CPU, CUDA,
    ROCm, XPU, MPS): what each kind has is decided in `hardware.capabilities`."""
    spec = get_spec(name)
    if spec.tf32 and not info.has_tf32:
        raise UsageError(
            f"tf32 needs {REQUIREMENTS['tf32']}; {_lacking(info, 'tf32')}: use fp32 "
            "(or fp16-mixed on a GPU with fp16 matrix units)"
        )
    if spec.native_low_bit:
        _check_native_low_bit(spec, info)
    key = spec.low_precision_key
    if key is None:
        return []
    native = info.native_bf16 if key == "bf16" else info.native_fp16
    if info.type != "cpu":
        if key == "bf16" and not native:
            raise UsageError(
                f"{spec.name} needs native bf16, which {_lacking(info, 'bf16', verb='lacks')}: use fp16-mixed "
                "(fp16 with loss scaling is the fast path there, e.g. on Volta/Turing)"
            )
        return []
    if native:
        return []
    return [
        f"{spec.name} is emulated on this CPU ({info.name}: no native {key} instructions), so it runs "
        f"many times slower than fp32 here; mixed precision is a hardware feature: use fp32 on this "
        "machine, or a GPU"
    ]


def _check_native_low_bit(spec: PrecisionSpec, info: DeviceInfo) -> None:
    """Refuse native low-bit Linears where the device lacks the format's matrix units (the registry's
    `NativeRule`, applied by `hardware.capabilities`) or no kernel exists for them; the fix names the
    emulated twin, which runs anywhere and measures the format's fidelity (not its speed)."""
    key, twin = spec.matmul_key, spec.emulated_twin
    if not info.is_native(key):
        raise UsageError(
            f"{spec.name} needs {REQUIREMENTS[key]}; {_lacking(info, key)}: use bf16-mixed, or {twin} to "
            f"exercise the {spec.name} code path without a speedup (it measures {spec.name}'s fidelity)"
        )
    missing = converter_class(spec.linear_format).native_missing
    if missing:
        raise UsageError(f"{spec.name}: {missing}: use {twin} to measure its fidelity, or bf16-mixed")


def _lacking(info: DeviceInfo, key: str, *, verb: str = "has none") -> str:
    """ "Tesla V100-SXM2-16GB (sm_70) has none" plus why, for a device of `info`'s kind."""
    note = absence_note(info.kind, key)
    return f"{info.where} {verb}" + (f" ({note})" if note else "")


def build_precision(
    name: str,
    *,
    device_type: str,
    scaler: ScalerConfig | None = None,
    fp8: Fp8Options | None = None,
    overrides: ModuleOverrides | None = None,
) -> Precision:
    """The policy object for a precision name or alias; `fp8`: the fp8 recipe and roofline filter;
    `overrides`: modules kept in another regime (`--keep-fp32`), applied by its `convert_module`."""
    spec = get_spec(name)
    if spec.converts_linears:
        return LowBitPrecision(spec, device_type=device_type, scaler=scaler, fp8=fp8, overrides=overrides)
    if spec.autocast:
        return AutocastPrecision(spec, device_type=device_type, scaler=scaler, overrides=overrides)
    if spec.low_precision_weights:
        return TruePrecision(spec, device_type=device_type, overrides=overrides)
    return Precision(spec, device_type=device_type, overrides=overrides)
