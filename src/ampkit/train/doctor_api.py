"""`ampkit.doctor.run(task, **settings)`: `ampkit doctor` from Python, `--from` included.

Plain doctor is `ampkit.diagnostics.api.run`; with `from_run="RUN_DIR[@STEP]"` (and `replays`, `try_fixes`,
`also_try`, as the flags) it is a train run's failing window replayed (`ampkit.train.replay`). It lives in
train because the replay needs train's resume, which diagnostics never imports. `replay_to_dir` is what
`ampkit doctor --from` runs too: the replay, then its run directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from ampkit.diagnostics.config import DoctorConfig
from ampkit.diagnostics.doctor_report import write_report
from ampkit.errors import UsageError
from ampkit.runs import SUMMARY_FILE, create_run_dir, summary_marks_write_failure, write_json_atomic
from ampkit.tasks.load import keyword_config, split_task
from ampkit.train.replay import replay_run


def replay_to_dir(
    config: DoctorConfig, out: str | Path | None, *, console: Console | None = None
) -> tuple[dict[str, Any], Path]:
    """`doctor --from`: the replay (with `--try-fixes`: each fix too), then its run directory (config.json,
    summary.json, report.html and report.md), made once the replay ran: a bad RUN_DIR leaves none behind."""
    summary = replay_run(
        config.from_run,
        passes=config.replays,
        ring_size=config.ring_size,
        try_fixes=config.try_fixes,
        also_try=config.also_try,
    )
    run_dir = create_run_dir(None if out is None else str(out), "doctor")
    write_json_atomic(run_dir / "config.json", summary["config"])
    with summary_marks_write_failure(run_dir, "doctor", console):  # disk full: "status": "failed"
        write_json_atomic(run_dir / SUMMARY_FILE, summary)
        write_report(summary, run_dir)
    return summary, run_dir


def run(
    task: Any = None, *, out: str | Path | None = None, config: str | Path | None = None, **settings: Any
) -> dict[str, Any]:
    """`ampkit doctor` on `task`, or on a train run's window with `from_run=` (no task: the run's own);
    returns the summary (summary.json and report.html are written)."""
    from ampkit.diagnostics.api import run as run_diagnosis

    spec, _ = split_task(task)
    resolved = keyword_config(DoctorConfig, spec, config, settings)
    if not resolved.from_run:
        return run_diagnosis(task, out=out, config=config, **settings)
    if task is not None:
        raise UsageError("from_run replays the run's own task and model: pass no task with it")
    return replay_to_dir(resolved, out)[0]
