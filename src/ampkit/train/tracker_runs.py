"""RUN_DIR/loggers.json: which W&B run and which MLflow run (at which tracking URI) a run directory logs
to, so that `ampkit train --resume RUN_DIR` continues the same tracker run instead of starting another."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ampkit.runs import write_json_atomic

TRACKER_RUNS_FILE = "loggers.json"

RUN_STATUSES = ("completed", "stopped", "failed", "diverged")
"""How a run ended, as `loop.RunStatus` names it: what a logger's `close(status)` is told."""


def read_tracker_runs(run_dir: str | Path) -> dict[str, Any]:
    """{"wandb": {...}, "mlflow": {...}} of an earlier attempt (empty: none, or unreadable)."""
    path = Path(run_dir) / TRACKER_RUNS_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def save_tracker_run(run_dir: str | Path, tracker: str, entry: dict[str, Any]) -> None:
    """Record `tracker`'s run (its id and where it lives) beside the others'."""
    saved = read_tracker_runs(run_dir)
    saved[tracker] = entry
    write_json_atomic(Path(run_dir) / TRACKER_RUNS_FILE, saved)
