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
"""

from ampkit.bench.api import run
from ampkit.bench.config import BenchConfig
from ampkit.bench.recommend import Candidate, Recommendation, recommend
from ampkit.bench.runner import plan_bench, run_bench
from ampkit.bench.schema import validate_summary

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
