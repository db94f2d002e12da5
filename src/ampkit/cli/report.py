"""`ampkit report RUN_DIR`: re-render a run's report from its summary.json (and metrics.jsonl for train).

Any run directory an ampkit command writes is rendered again byte for byte: the writers read
nothing but the run's files (the date, versions, device and command line come from summary.json's
"provenance" block), and PNGs carry no metadata. The run's kind is its summary's "schema"; summaries
written before train and hw had one are known by their "command". A command plugs in by adding an
entry to RENDERERS.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

from ampkit.cli import add_command
from ampkit.errors import UsageError
from ampkit.runs import SUMMARY_FILE, lock_run_dir, read_json


def _kind_of_plan(summary: dict[str, Any]) -> str:
    return "ampkit.plan/1+lora" if "methods" in summary else "ampkit.plan/1"  # plan --lora: its own tables


# kind -> ("module:renderer(summary, run_dir) -> written paths", "module:validator(summary) -> problems" or None)
RENDERERS: dict[str, tuple[str, str | None]] = {
    "ampkit.bench/2": ("ampkit.bench.report:render_report", "ampkit.bench.schema:validate_summary"),
    "ampkit.bench-inference/1": ("ampkit.bench.inference_render:render_inference_report", None),
    "ampkit.bench-sweep/1": ("ampkit.bench.sweep:render_sweep_report", None),
    "ampkit.train/1": ("ampkit.train.report:write_train_report", None),
    "ampkit.doctor/1": ("ampkit.diagnostics.doctor_report:write_report", None),
    "ampkit.plan/1": ("ampkit.plan.render.report:write_plan_report", None),
    "ampkit.plan/1+lora": ("ampkit.plan.lora.plan:write_lora_plan_report", None),
    "ampkit.plan-task/1": ("ampkit.plan.task_plan:write_task_plan_report", None),
    "ampkit.kv/1": ("ampkit.plan.render.report:write_kv_report", None),
    "ampkit.kv-measured/1": ("ampkit.plan.kv.measured:write_measured_report", None),
    "ampkit.hw/1": ("ampkit.cli.hw:write_hw_report", None),
}
# summaries without a "schema" (train's and the bench sweep's before they had one): by their "command"
_BY_COMMAND = {"train": "ampkit.train/1", "bench-sweep": "ampkit.bench-sweep/1", "bench": "ampkit.bench/2"}


def register(sub) -> argparse.ArgumentParser:
    parser = add_command(
        sub,
        "report",
        "Re-render report.html, report.md and their figures in RUN_DIR from its summary.json (and "
        "metrics.jsonl for train), byte for byte as the run wrote them. Works on every run directory "
        "ampkit writes: bench (--inference, --sweep, --lora), train, doctor, plan, kv and hw --out.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding summary.json")
    parser.add_argument("--json", action="store_true", help="also print summary.json to stdout")
    return parser


def load_summary(run_dir: Path) -> dict:
    if not run_dir.exists():
        raise UsageError(f"{run_dir} does not exist; pass a run directory written by an ampkit command")
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory; pass a run directory written by an ampkit command")
    path = run_dir / SUMMARY_FILE
    if not path.is_file():
        raise UsageError(f"{run_dir} holds no {SUMMARY_FILE}, so it is not an ampkit run directory")
    summary = read_json(path, remedy="re-run the command that wrote it")
    if not isinstance(summary, dict):
        raise UsageError(f"{path} is not a JSON object, so it was not written by ampkit")
    return summary


def kind_of(summary: dict[str, Any], path: Path) -> str:
    """The run's kind (a RENDERERS key) from its schema, or its command for older summaries."""
    schema = summary.get("schema")
    if schema == "ampkit.plan/1":
        return _kind_of_plan(summary)
    if schema in RENDERERS:
        return schema
    if set(summary) <= {"command", "status", "error"} and summary.get("status") == "failed":
        # `runs.summary_marks_write_failure` before any summary was written (a full disk): nothing to render
        raise UsageError(f"{path} is the summary of a run that failed ({summary.get('error')}); there is no report")
    if schema is None and summary.get("command") in _BY_COMMAND:
        return _BY_COMMAND[summary["command"]]
    family = [k for k in RENDERERS if isinstance(schema, str) and k.split("/")[0] == schema.split("/")[0]]
    if family:
        raise UsageError(f"{path} has schema {schema!r}, from another ampkit version; this one renders {family[0]}")
    what = f"schema {schema!r}" if schema is not None else "no 'schema' field"
    known = ", ".join(k for k in RENDERERS if "+" not in k)
    raise UsageError(f"{path} has {what}: not a summary ampkit writes (it renders {known})")


def _resolve(ref: str):
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _validate(validator: str | None, summary: dict[str, Any], path: Path) -> None:
    problems = _resolve(validator)(summary) if validator else []
    if problems:
        more = f", and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise UsageError(f"{path} does not match its schema ({problems[0]}{more})")


def _render(renderer: str, summary: dict[str, Any], run_dir: Path, path: Path) -> Any:
    """A summary that claims a schema but lacks what its renderer reads is one line, not a traceback."""
    try:
        return _resolve(renderer)(summary, run_dir)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise UsageError(
            f"{path} is incomplete for its schema ({type(err).__name__}: {err}); re-run the command that wrote it"
        ) from None


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    summary = load_summary(run_dir)
    path = run_dir / SUMMARY_FILE
    renderer, validator = RENDERERS[kind_of(summary, path)]
    _validate(validator, summary, path)
    lock_run_dir(run_dir, command="report")  # it writes into RUN_DIR: not while a run is writing there
    paths = _render(renderer, summary, run_dir, path)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0
