"""`ampkit report RUN_DIR`: re-render a run's report from its summary.json (and metrics.jsonl for train);
`ampkit report --schema KIND|all [--out DIR]`: print (or write) the summary kinds' JSON Schemas.

Any run directory an ampkit command writes is rendered again byte for byte: the writers read
nothing but the run's files (the date, versions, device and command line come from summary.json's
"provenance" block), and PNGs carry no metadata. The run's kind (`ampkit.summaries`: its schema id, or
the older form of a kind, e.g. train's summaries before they had a "schema") decides the validator and
the renderer: RENDERERS maps each kind's name to its renderer, imported only when that kind is rendered.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ampkit.cli import add_command
from ampkit.errors import UsageError
from ampkit.runs import SUMMARY_FILE, lock_run_dir, make_dir, read_json, write_failed, write_text_atomic
from ampkit.summaries import KINDS, SummaryKind, find_kind, kind_of_summary, same_family

Renderer = Callable[[dict[str, Any], Path], Any]
"""renderer(summary, run_dir) -> the paths it wrote (report.html, report.md, figures)."""


def _bench() -> Renderer:
    from ampkit.bench.report import render_report

    return render_report


def _bench_inference() -> Renderer:
    from ampkit.bench.inference_render import render_inference_report

    return render_inference_report


def _bench_sweep() -> Renderer:
    from ampkit.bench.sweep import render_sweep_report

    return render_sweep_report


def _train() -> Renderer:
    from ampkit.train.report import write_train_report

    return write_train_report


def _doctor() -> Renderer:
    from ampkit.diagnostics.doctor_report import write_report

    return write_report


def _plan() -> Renderer:
    from ampkit.plan.render.report import write_plan_report

    return write_plan_report


def _plan_lora() -> Renderer:
    from ampkit.plan.lora.plan import write_lora_plan_report

    return write_lora_plan_report


def _plan_task() -> Renderer:
    from ampkit.plan.task_plan import write_task_plan_report

    return write_task_plan_report


def _kv() -> Renderer:
    from ampkit.plan.render.report import write_kv_report

    return write_kv_report


def _kv_measured() -> Renderer:
    from ampkit.plan.kv.measured import write_measured_report

    return write_measured_report


def _hw() -> Renderer:
    from ampkit.cli.hw import write_hw_report

    return write_hw_report


def _data_stats() -> Renderer:
    from ampkit.cli.data import write_data_stats_report

    return write_data_stats_report


def _callback() -> Renderer:
    from ampkit.integrations.report import write_callback_report

    return write_callback_report


RENDERERS: dict[str, Callable[[], Renderer]] = {
    "bench": _bench,
    "bench-inference": _bench_inference,
    "bench-sweep": _bench_sweep,
    "train": _train,
    "doctor": _doctor,
    "plan": _plan,
    "plan-lora": _plan_lora,
    "plan-task": _plan_task,
    "kv": _kv,
    "kv-measured": _kv_measured,
    "hw": _hw,
    "data-stats": _data_stats,
    "callback": _callback,
}
"""kind name (`ampkit.summaries.KINDS`) -> its renderer, imported when a run of that kind is rendered
(the command's package loads only then). tests/cli/test_report.py checks every kind has one."""


def register(sub) -> argparse.ArgumentParser:
    parser = add_command(
        sub,
        "report",
        "Re-render report.html, report.md and their figures in RUN_DIR from its summary.json (and "
        "metrics.jsonl for train), byte for byte as the run wrote them. Works on every run directory "
        "ampkit writes: bench (--inference, --sweep, --lora), train, doctor, plan, kv, hw --out, data "
        "stats --out and the transformers/Lightning callback's.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="a run directory holding summary.json")
    parser.add_argument("--json", action="store_true", help="also print summary.json to stdout")
    parser.add_argument(
        "--schema",
        metavar="KIND|all",
        help="print the JSON Schema of a summary kind instead (a name or schema id: "
        + ", ".join(kind.name for kind in KINDS)
        + "; all: every kind, an object by name)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="with --schema: write KIND.schema.json (every kind's, with all) into DIR instead of printing; "
        f"a checkout's docs/schemas is regenerated with `{REGENERATE}`",
    )
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


def kind_of(summary: dict[str, Any], path: Path) -> SummaryKind:
    """The run's kind from its schema id (or the older form of a kind), else why it has none."""
    if set(summary) <= {"command", "status", "error"} and summary.get("status") == "failed":
        # `runs.summary_marks_write_failure` before any summary was written (a full disk): nothing to render
        raise UsageError(f"{path} is the summary of a run that failed ({summary.get('error')}); there is no report")
    kind = kind_of_summary(summary)
    if kind is not None:
        return kind
    schema = summary.get("schema")
    family = same_family(schema)
    if family is not None:
        raise UsageError(f"{path} has schema {schema!r}, from another ampkit version; this one renders {family.schema}")
    what = f"schema {schema!r}" if schema is not None else "no 'schema' field"
    known = ", ".join(kind.schema for kind in KINDS)
    raise UsageError(f"{path} has {what}: not a summary ampkit writes (it renders {known})")


def _validate(kind: SummaryKind, summary: dict[str, Any], path: Path) -> None:
    problems = kind.validate(summary)
    if problems:
        more = f", and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise UsageError(f"{path} does not match its schema {kind.schema} ({problems[0]}{more})")


def _render(kind: SummaryKind, summary: dict[str, Any], run_dir: Path, path: Path) -> Any:
    """A summary that claims a schema but lacks what its renderer reads is one line, not a traceback."""
    try:
        return RENDERERS[kind.name]()(summary, run_dir)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise UsageError(
            f"{path} is incomplete for its schema ({type(err).__name__}: {err}); re-run the command that wrote it"
        ) from None


REGENERATE = "python -m ampkit report --schema all --out docs/schemas"
"""The one command that rewrites the published schemas (docs/schemas.md; tests/summaries/test_published.py)."""


def schema_kinds(name: str) -> tuple[SummaryKind, ...]:
    """The kinds `--schema NAME` names: every kind for `all`, else the one by name or schema id."""
    if name == "all":
        return KINDS
    kind = find_kind(name)
    if kind is None:
        known = ", ".join(kind.name for kind in KINDS)
        raise UsageError(f"--schema {name}: no such summary kind; choose one of {known}, or all")
    return (kind,)


def write_schemas(kinds: tuple[SummaryKind, ...], out: Path) -> list[Path]:
    """Each kind's `schema_text()` as DIR/`schema_file`, each written whole or not at all."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; pass a directory for the schema files")
    make_dir(out)
    paths = []
    for kind in kinds:
        path = out / kind.schema_file
        try:
            write_text_atomic(path, kind.schema_text())
        except OSError as err:
            raise write_failed(path, err) from None
        paths.append(path)
    return paths


def print_schema(name: str, out: str | None) -> int:
    kinds = schema_kinds(name)
    if out is not None:
        for path in write_schemas(kinds, Path(out)):
            print(f"wrote {path}")
    elif name == "all":
        print(json.dumps({kind.name: kind.json_schema() for kind in kinds}, indent=2, ensure_ascii=False))
    else:
        print(kinds[0].schema_text(), end="")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.schema is not None:
        if args.run_dir is not None:
            raise UsageError("--schema KIND prints a JSON Schema and reads no run directory: pass one or the other")
        return print_schema(args.schema, args.out)
    if args.out is not None:
        raise UsageError("--out DIR is where --schema KIND|all writes its files; a report is written into RUN_DIR")
    if args.run_dir is None:
        raise UsageError("pass a RUN_DIR to render (or --schema KIND for a summary kind's JSON Schema)")
    run_dir = Path(args.run_dir)
    summary = load_summary(run_dir)
    path = run_dir / SUMMARY_FILE
    kind = kind_of(summary, path)
    _validate(kind, summary, path)
    lock_run_dir(run_dir, command="report")  # it writes into RUN_DIR: not while a run is writing there
    paths = _render(kind, summary, run_dir, path)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0
