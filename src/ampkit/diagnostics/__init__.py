"""Numerics diagnostics: non-finite locator, gradient statistics, fault injection, fp32 fixes.

The hook-level pieces are importable from here. The parts that train models (`smoke`,
`layer_fidelity`, `doctor`) import `ampkit.train` and live in their own modules:
`from ampkit.diagnostics.config import DoctorConfig` (the config alone imports no model code),
`from ampkit.diagnostics.doctor import run_doctor`.
"""

from ampkit.diagnostics.fixes import keep_in_fp32
from ampkit.diagnostics.gradstats import (
    GradientStatistics,
    ScaleRange,
    StepGradStats,
    TensorGradStats,
    flush_fraction,
    long_tail,
    loss_scale_range,
)
from ampkit.diagnostics.inject import FaultInjector, FaultSpec, corrupt, parse_fault_spec, resolve_module
from ampkit.diagnostics.locator import Finding, Frame, NonFiniteLocator, TensorStats, tensor_stats
from ampkit.diagnostics.scale import ScaleTrajectory
from ampkit.diagnostics.unsafe import NaiveExpGate, insert_unsafe_op

__all__ = [
    "FaultInjector",
    "FaultSpec",
    "Finding",
    "Frame",
    "GradientStatistics",
    "NaiveExpGate",
    "NonFiniteLocator",
    "ScaleRange",
    "ScaleTrajectory",
    "StepGradStats",
    "TensorGradStats",
    "TensorStats",
    "corrupt",
    "flush_fraction",
    "insert_unsafe_op",
    "keep_in_fp32",
    "long_tail",
    "loss_scale_range",
    "parse_fault_spec",
    "resolve_module",
    "tensor_stats",
]
