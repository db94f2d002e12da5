"""`ampkit.train.run(task, **settings)`: the Python API of `ampkit train` (see `ampkit.api`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from ampkit.runs import create_run_dir
from ampkit.tasks.load import keyword_config, split_task


def run(
    task: Any = None,
    *,
    out: str | Path | None = None,
    config: str | Path | None = None,
    resume: str | Path | None = None,
    stop_after: int = 0,
    show_progress: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """`ampkit train` on `task` (or `resume=RUN_DIR` with the same task); returns the summary.
    `stop_after` > 0 stops this call with a checkpoint after that many steps (`--stop-after`)."""
    from ampkit.train.build import build_run
    from ampkit.train.config import TrainConfig, resume_config
    from ampkit.train.loop import run_training

    spec, obj = split_task(task)
    if resume is not None:
        resolved, run_dir = resume_config(resume, settings), Path(resume)
    else:
        resolved, run_dir = keyword_config(TrainConfig, spec, config, settings), None
    objs = build_run(resolved, task=obj)
    clean = False
    try:
        run_dir = run_dir or create_run_dir(None if out is None else str(out), "train")
        summary = run_training(
            objs,
            run_dir,
            resume=resume is not None,
            console=Console(stderr=True),
            show_progress=show_progress,
            stop_after=stop_after,
        )
        clean = True
        return summary
    finally:
        objs.parallel.close(clean=clean)
