"""`ampkit report RUN_DIR`: re-render a run's report from its summary.json.

Renderers are looked up by the summary's "command"; a command plugs in by adding an entry to
RENDERERS (module path, function taking (summary, run_dir) and returning the written paths).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from ampkit.cli import add_command
from ampkit.errors import UsageError
from ampkit.runs import SUMMARY_FILE, lock_run_dir, read_json

# command -> (module, renderer function, validator function or None)
RENDERERS: dict[str, tuple[str, str, str | None]] = {
    "bench": ("ampkit.bench.render", "render_report", "ampkit.bench.schema:validate_summary"),
    "bench-sweep": ("ampkit.bench.sweep", "render_sweep_report", None),
}


def register(sub) -> argparse.ArgumentParser:
    parser = add_command(sub, "report", "Re-render report.html and report.md of RUN_DIR from its summary.json.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding summary.json")
    parser.add_argument("--json", action="store_true", help="also print summary.json to stdout")
    return parser


def load_summary(run_dir: Path) -> dict:
    path = run_dir / SUMMARY_FILE
    if not path.is_file():
        raise UsageError(f"{run_dir} holds no {SUMMARY_FILE}; pass a run directory written by an ampkit command")
    summary = read_json(path, remedy="re-run the command that wrote it")
    if not isinstance(summary, dict) or "command" not in summary:
        raise UsageError(f"{path} has no 'command' field; it was not written by ampkit")
    return summary


def _resolve(ref: str):
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    summary = load_summary(run_dir)
    lock_run_dir(run_dir, command="report")  # it writes into RUN_DIR: not while a run is writing there
    command = summary["command"]
    if command not in RENDERERS:
        known = ", ".join(RENDERERS)
        raise UsageError(f"no report renderer for '{command}' runs yet (renderers exist for: {known})")
    module, function, validator = RENDERERS[command]
    if validator:
        problems = _resolve(validator)(summary)
        if problems:
            raise UsageError(
                f"{run_dir / SUMMARY_FILE} does not match its schema ({problems[0]}"
                + (f", and {len(problems) - 1} more" if len(problems) > 1 else "")
                + ")"
            )
    paths = getattr(importlib.import_module(module), function)(summary, run_dir)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0
