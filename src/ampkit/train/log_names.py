"""The one name table every logger shares: a metrics.jsonl record's key -> its metric name, so TensorBoard,
W&B and MLflow show the same metrics under the same names (`train/loss` is `train/loss` in all three).

Names are `group/metric`: TensorBoard groups tags by the part before the slash, W&B makes a panel
section of it, and MLflow allows slashes in metric names (its rule: alphanumerics, `_ - . /` and
spaces). Units travel in the name where the number has one (`_per_s`, `_ms`, `_bytes`).
"""

from __future__ import annotations

import math
from typing import Any

METRIC_NAMES: dict[str, str] = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens": "train/tokens",
    "tokens_per_s": "throughput/tokens_per_s",
    "processed_tokens_per_s": "throughput/processed_tokens_per_s",
    "image_tokens_per_s": "throughput/image_tokens_per_s",
    "step_ms": "throughput/step_ms",
    "mfu": "throughput/mfu",
    "loss_scale": "precision/loss_scale",
    "skipped": "precision/skipped",
    "skipped_total": "precision/skipped_total",
    "padding_fraction": "data/padding_fraction",
    "memory_bytes": "memory/bytes",
    "peak_memory_bytes": "memory/peak_bytes",
    "eval_loss": "eval/loss",
}
"""record key -> metric name. `tokens`: the task's trained items so far (its unit: summary.json's "unit");
`tokens_per_s`: trained items per second of the last log window, `processed_tokens_per_s` the items read
(masked ones too), `step_ms` milliseconds per step of that window. Keys absent from a record (mfu, memory,
image tokens) or null in it (loss_scale without a scaler) are not logged; booleans (skipped) are 0/1."""

LOGGED_EVENTS = ("train", "eval")
"""The records loggers get metrics from; other events (rollbacks, gradient statistics) stay in the JSONL."""


def metrics_of(record: dict[str, Any]) -> dict[str, float]:
    """The metric names and values a record carries (empty for events the loggers do not show). NaN is
    left out (a diverged step's loss: the JSONL keeps it); an infinite rate is kept (a window of no time)."""
    if record.get("event", "train") not in LOGGED_EVENTS:
        return {}
    out = {}
    for key, name in METRIC_NAMES.items():
        value = record.get(key)
        if isinstance(value, (bool, int, float)) and not (isinstance(value, float) and math.isnan(value)):
            out[name] = float(value)
    return out


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A run's config (`dataclasses.asdict` of it) as MLflow params: `section.setting` -> its value as text
    (`optimizer.lr` -> "0.001", as the TOML table `[optimizer] lr` names it); nested tables go deeper."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, prefix=f"{name}."))
        else:
            out[name] = "" if value is None else str(value)
    return out
