"""ampkit.cli.report: `ampkit report RUN_DIR` re-renders a report from summary.json, or says why not."""

from __future__ import annotations

import json

import pytest

import ampkit.cli.report as report_cli
from ampkit.errors import UsageError
from ampkit.summaries import BY_NAME
from json_schema import errors_of


def _write(run_dir, text: str):
    run_dir.mkdir(exist_ok=True)
    (run_dir / "summary.json").write_text(text, encoding="utf-8")
    return run_dir


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "holds no summary.json"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "is not a JSON object"),
        (
            json.dumps({"command": "plan"}),
            "has no 'schema' field: not a summary ampkit writes (it renders ampkit.bench/2, ",
        ),
        (json.dumps({"command": "bench", "schema": "x"}), "has schema 'x': not a summary ampkit writes"),
        (json.dumps({"schema": "ampkit.bench/2"}), "does not match its schema ampkit.bench/2 (summary.command: "),
        (json.dumps({"schema": "ampkit.plan/1", "methods": {}}), "does not match its schema ampkit.plan-lora/1"),
        (json.dumps({"command": "bench", "status": "failed", "error": "disk full"}), "a run that failed (disk full)"),
    ],
)
def test_what_it_cannot_render_is_a_usage_error(parse, tmp_path, content, message):
    run_dir = tmp_path / "run"
    if content is None:
        run_dir.mkdir()
    else:
        _write(run_dir, content)
    with pytest.raises(UsageError) as err:
        report_cli.run(parse(report_cli, "report", str(run_dir)))
    assert message in str(err.value)


def test_a_sweep_summary_is_rendered_again(parse, tmp_path, capsys):
    summary = {
        "command": "bench-sweep",
        "precision": "fp32",
        "device": {"type": "cpu", "name": "cpu"},
        "fastest": None,
        "rows": [{"variant": "baseline", "status": "failed", "error": "killed"}],
    }
    run_dir = _write(tmp_path / "run", json.dumps(summary))
    assert report_cli.run(parse(report_cli, "report", str(run_dir))) == 0
    assert capsys.readouterr().out.startswith(f"wrote {run_dir / 'report.html'}, {run_dir / 'report.md'}")
    assert "baseline: failed: killed" in (run_dir / "report.html").read_text()
    assert report_cli.load_summary(run_dir) == summary


def test_every_kind_has_a_renderer_and_every_renderer_a_kind():
    assert set(report_cli.RENDERERS) == set(BY_NAME)
    assert all(callable(load()) for load in report_cli.RENDERERS.values())  # each import resolves


def test_a_summary_is_rendered_by_its_kinds_renderer(parse, tmp_path, monkeypatch):
    """The kind decides: a sweep summary from before the sweep had a schema goes to the sweep's renderer."""
    seen = []
    monkeypatch.setitem(report_cli.RENDERERS, "bench-sweep", lambda: lambda s, d: seen.append(s["precision"]) or [])
    summary = {"command": "bench-sweep", "precision": "fp32", "device": {"type": "cpu", "name": "c"}, "rows": []}
    run_dir = _write(tmp_path / "run", json.dumps({**summary, "fastest": None}))
    assert report_cli.run(parse(report_cli, "report", str(run_dir))) == 0 and seen == ["fp32"]


@pytest.mark.parametrize("name", ["plan-lora", "ampkit.plan-lora/1"])
def test_schema_prints_a_kinds_json_schema(run_cli, name):
    code, out, _ = run_cli("report", "--schema", name)
    schema = json.loads(out)
    assert code == 0 and schema["title"].startswith("ampkit.plan-lora/1: ")
    assert schema["$id"] == "ampkit.plan-lora/1"
    assert schema["properties"]["schema"]["enum"] == ["ampkit.plan-lora/1", "ampkit.plan/1"]
    assert errors_of({"schema": "ampkit.plan-lora/1"}, schema)  # methods, rows, ... required


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--schema", "nope"], "--schema nope: no such summary kind; choose one of bench, bench-inference, "),
        (["--schema", "hw", "somewhere"], "--schema KIND prints a JSON Schema and reads no run directory"),
        ([], "pass a RUN_DIR to render (or --schema KIND"),
    ],
)
def test_schema_and_run_dir_mistakes_are_one_line(run_cli, argv, message):
    code, out, err = run_cli("report", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err
