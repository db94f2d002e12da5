"""The Python API of the main commands: the same run directory and summary as the command line.

    import ampkit.bench, ampkit.train, ampkit.doctor
    summary = ampkit.bench.run(task, budget_s=5)             # or a spec: "mlp", "my_tasks.py:make_task"
    summary = ampkit.train.run(task, steps=100, out="runs/mine")
    summary = ampkit.doctor.run(task, precision="fp16-mixed")

`task` is a task object (`ampkit.tasks.Task`, e.g. a `SupervisedTask`), a task spec string, or None
for the language model the settings describe. Settings are the command's config fields by their flag
names (`batch_size=16`, `init_scale=4096.0`); `config=` names a TOML file they override; a mistake is a
`UsageError` with the same one-line message the command prints.

bench runs every precision in a fresh process, so a task *object* is pickled for them: define its
functions and classes at module level (a script's own, under `if __name__ == "__main__":`, work the
way multiprocessing's spawn does: the worker imports the script first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from ampkit.config import resolve_config
from ampkit.errors import RunInterrupted
from ampkit.runs import SUMMARY_FILE, create_run_dir, write_json_atomic
from ampkit.tasks.load import PYTHON_OBJECT


def _split_task(task: Any) -> tuple[str, Any]:
    """(the config's `task` spec, the task object or None)."""
    if task is None:
        return "", None
    if isinstance(task, str):
        return task, None
    return PYTHON_OBJECT + str(getattr(task, "name", type(task).__name__)), task


def _config(cls, task_spec: str, config: str | Path | None, settings: dict[str, Any]):
    base = {"task": task_spec, **settings} if task_spec else settings
    return resolve_config(cls, toml_path=config, base=base, base_source="the keyword arguments")


def bench(
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

    spec, obj = _split_task(task)
    resolved = _config(BenchConfig, spec, config, settings)
    summary, _ = run_bench(
        resolved, out=out, console=Console(stderr=True), show_progress=show_progress, task_object=obj
    )
    return summary


def train(
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

    spec, obj = _split_task(task)
    if resume is not None:
        resolved, run_dir = resume_config(resume, settings), Path(resume)
    else:
        resolved, run_dir = _config(TrainConfig, spec, config, settings), None
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


def doctor(
    task: Any = None, *, out: str | Path | None = None, config: str | Path | None = None, **settings: Any
) -> dict[str, Any]:
    """`ampkit doctor` on `task`; returns the summary (summary.json and report.html are written)."""
    from ampkit.diagnostics.config import DoctorConfig
    from ampkit.diagnostics.doctor import run_doctor
    from ampkit.diagnostics.doctor_report import write_report

    spec, obj = _split_task(task)
    resolved = _config(DoctorConfig, spec, config, settings)
    result = run_doctor(resolved, task=obj)
    run_dir = create_run_dir(None if out is None else str(out), "doctor")
    write_json_atomic(run_dir / "config.json", result.summary["config"])
    write_json_atomic(run_dir / SUMMARY_FILE, result.summary)
    write_report(result.summary, run_dir)
    if result.signum is not None:  # SIGINT/SIGTERM: the parts finished are written, as the command does
        where = run_dir / SUMMARY_FILE
        raise RunInterrupted(f"doctor interrupted; what was measured is in {where}", signum=result.signum)
    return result.summary
