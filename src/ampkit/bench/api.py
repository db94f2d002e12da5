"""`ampkit.bench.run(task, **settings)`: the Python API of `ampkit bench` (see `ampkit.api`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from ampkit.tasks.load import keyword_config, split_task


def run(
    task: Any = None,
    *,
    out: str | Path | None = None,
    config: str | Path | None = None,
    show_progress: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """`ampkit bench` on `task`; returns summary.json's content (also written, with the reports)."""
    from ampkit.bench.config import BenchConfig
    from ampkit.bench.runner import run_bench

    spec, obj = split_task(task)
    resolved = keyword_config(BenchConfig, spec, config, settings)
    summary, _ = run_bench(
        resolved, out=out, console=Console(stderr=True), show_progress=show_progress, task_object=obj
    )
    return summary
