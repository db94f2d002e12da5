"""ampkit.cli.report: `ampkit report RUN_DIR` re-renders a report from summary.json, or says why not."""

from __future__ import annotations

import json

import pytest

import ampkit.cli.report as report_cli
from ampkit.errors import UsageError


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
        (json.dumps({"schema": "ampkit.bench/2"}), "does not match its schema"),
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
