"""Planning without the hardware: memory ledgers (analytic and traced), fit, compute, KV cache, advice.

- `describe_model`: a preset or Hugging Face config.json -> `ModelDescription` (exact parameter count)
- `analytic_ledger` / `traced_ledger`: a training step's memory by line, at its peak
- `fit`, `resolve_target`: fits on a GPU, headroom, largest micro-batch / sequence (`Reserve`: the
  framework reserve both engines and the searches add: CUDA context bytes + fragmentation)
- `step_compute`: FLOPs per token and step, step time at peak and at an MFU
- `kv_budget`: KV-cache tokens per KV dtype
- `cheapest_fix`, `base_precision`: advice
The traced engine (`ampkit.plan.traced.trace`) is imported on demand: it loads fake-tensor machinery.
"""

from ampkit.plan.advice import Fix, base_precision, cheapest_fix
from ampkit.plan.analytic.compute import (
    StepCompute,
    flops_per_token,
    model_flops_per_token,
    seconds_at,
    step_compute,
    weights_gb,
)
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.describe import ModelDescription, describe_config, describe_model, from_model_config
from ampkit.plan.fit import Fit, Target, fit, largest, parse_memory, resolve_target
from ampkit.plan.kv.budget import KvBudget, kv_budget, kv_bytes_per_token, kv_pool_bytes
from ampkit.plan.setting import GIB, Ledger, Reserve, StepSetting

__all__ = [
    "GIB",
    "Fit",
    "Fix",
    "KvBudget",
    "Ledger",
    "ModelDescription",
    "Reserve",
    "StepCompute",
    "StepSetting",
    "Target",
    "analytic_ledger",
    "base_precision",
    "cheapest_fix",
    "describe_config",
    "describe_model",
    "fit",
    "flops_per_token",
    "from_model_config",
    "kv_budget",
    "kv_bytes_per_token",
    "kv_pool_bytes",
    "largest",
    "model_flops_per_token",
    "parse_memory",
    "resolve_target",
    "seconds_at",
    "step_compute",
    "weights_gb",
]
