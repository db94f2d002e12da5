"""Which engine plans a model: the analytic ledger where it exists, the traced one everywhere.

- a preset, or a Hugging Face config of the analytic families (llama, mistral, qwen2, gpt2, opt):
  the analytic engine answers (ledger, fit, advice: microseconds a setting); with transformers
  installed, an `hf:`/config.json model is also traced (transformers' own modules, the model
  `ampkit train --model hf:PATH` trains; extrapolated from shallow traces) and the two are
  cross-checked row by row; a preset is traced with `--trace` (ampkit's own model, `plan/traced/trace.py`);
- any other transformers architecture: the traced engine answers everything
  (`extrapolate.HFTracedEngine`), and the plan says there is no analytic ledger to compare with.
Both engines offer `ledger(setting)`, `fit(setting, total, capacity)` and `largest(...)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.describe import ModelDescription
from ampkit.plan.describe.hf import HFDescription, has_analytic
from ampkit.plan.fit import Fit, SearchField, fit, largest
from ampkit.plan.setting import DEFAULT_RESERVE, Ledger, Reserve, StepSetting

if TYPE_CHECKING:
    from ampkit.plan.traced.cache import TraceCache


class AnalyticEngine:
    """`plan/analytic/ledger.py`'s replay behind the engine interface."""

    name = "analytic"
    note = "analytic"

    def __init__(self, desc: ModelDescription, *, reserve: Reserve = DEFAULT_RESERVE):
        self.desc, self.reserve = desc, reserve

    def ledger(self, setting: StepSetting) -> Ledger:
        return analytic_ledger(self.desc, setting, reserve=self.reserve)

    def fit(self, setting: StepSetting, total_bytes: int, capacity: int) -> Fit:
        return fit(self.desc, setting, total_bytes, capacity, reserve=self.reserve)

    def largest(self, setting: StepSetting, capacity: int, *, field: SearchField, **kwargs) -> int:
        return largest(self.desc, setting, capacity, field=field, reserve=self.reserve, **kwargs)


def primary_engine(desc: ModelDescription, *, reserve: Reserve = DEFAULT_RESERVE, cache: TraceCache | None = None):
    """The engine whose ledgers a plan's fit and advice use (`cache`: the traced engine's disk cache)."""
    if has_analytic(desc):
        return AnalyticEngine(desc, reserve=reserve)
    assert isinstance(desc, HFDescription), "only transformers models lack the analytic engine"
    from ampkit.plan.traced.extrapolate import HFTracedEngine

    return HFTracedEngine(desc, reserve=reserve, cache=cache)


def hf_traced_engine(
    desc: ModelDescription, primary, *, reserve: Reserve = DEFAULT_RESERVE, cache: TraceCache | None = None
):
    """The traced engine of a transformers model (the primary one when it is already traced); None
    for presets (their `--trace` is `plan/traced/trace.py`'s)."""
    if not isinstance(desc, HFDescription):
        return None
    if primary.name == "traced":
        return primary
    from ampkit.plan.traced.extrapolate import HFTracedEngine

    return HFTracedEngine(desc, reserve=reserve, cache=cache)
