"""`ampkit bench`: every precision side by side on this device -- throughput, memory, fidelity against
fp32, stability -- and a recommendation in numbers.

- `config`: BenchConfig (flags and TOML keys), device defaults, precision lists.
- `runner`: checks up front, one worker process per precision (`worker`), then summary and reports;
  `session` runs them in order under the budget's promise (`budget`), `peaks` measures the MFU denominators.
- `fidelity`, `timing`, `profile`, `recommend`: the measurements and the decision, as small testable pieces.
- `summary` / `schema`: summary.json ("ampkit.bench/2") and its validator; `render`: the console and the
  report's rows, `figures` its plots, `report` report.html / report.md.
- `run(task, **settings)`: the Python API (`api.py`; `ampkit.api.bench` is the same function).
- `memory_check`: the up-front "does it fit" check (the memory planner's ledger), the planner's predicted
  step peak, and the largest micro-batch that fits (the recommendation's train command).

The names below load their module on first use: a worker process (`python -m ampkit.bench.worker`)
imports this package first, and needs neither the runner (rich's progress bars, the planner) nor the
summary (its validators) to start its run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampkit.bench.api import run
    from ampkit.bench.config import BenchConfig
    from ampkit.bench.recommend import Candidate, Recommendation, recommend
    from ampkit.bench.runner import plan_bench, run_bench
    from ampkit.bench.schema import validate_summary

_WHERE = {
    "run": "ampkit.bench.api",
    "BenchConfig": "ampkit.bench.config",
    "Candidate": "ampkit.bench.recommend",
    "Recommendation": "ampkit.bench.recommend",
    "recommend": "ampkit.bench.recommend",
    "plan_bench": "ampkit.bench.runner",
    "run_bench": "ampkit.bench.runner",
    "validate_summary": "ampkit.bench.schema",
}
__all__ = [
    "BenchConfig",
    "Candidate",
    "Recommendation",
    "plan_bench",
    "recommend",
    "run",
    "run_bench",
    "validate_summary",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
