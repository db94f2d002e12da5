"""`ampkit.doctor.run(task, **settings)`: the Python API of `ampkit doctor` (see `ampkit.api`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampkit.errors import RunInterrupted
from ampkit.runs import SUMMARY_FILE, create_run_dir, write_json_atomic
from ampkit.tasks.load import keyword_config, split_task


def run(
    task: Any = None, *, out: str | Path | None = None, config: str | Path | None = None, **settings: Any
) -> dict[str, Any]:
    """`ampkit doctor` on `task`; returns the summary (summary.json and report.html are written)."""
    from ampkit.diagnostics.config import DoctorConfig
    from ampkit.diagnostics.doctor import run_doctor
    from ampkit.diagnostics.doctor_report import write_report

    spec, obj = split_task(task)
    resolved = keyword_config(DoctorConfig, spec, config, settings)
    result = run_doctor(resolved, task=obj)
    run_dir = create_run_dir(None if out is None else str(out), "doctor")
    write_json_atomic(run_dir / "config.json", result.summary["config"])
    write_json_atomic(run_dir / SUMMARY_FILE, result.summary)
    write_report(result.summary, run_dir)
    if result.signum is not None:  # SIGINT/SIGTERM: the parts finished are written, as the command does
        where = run_dir / SUMMARY_FILE
        raise RunInterrupted(f"doctor interrupted; what was measured is in {where}", signum=result.signum)
    return result.summary
