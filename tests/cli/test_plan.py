"""ampkit.cli.plan: `ampkit plan` writes its run directory and prints the tables or the JSON."""

from __future__ import annotations

import json

import ampkit.cli.plan as plan_cli


def test_console_takes_columns_from_the_environment(monkeypatch):
    from ampkit.report.console import WIDE_WIDTH, make_console

    monkeypatch.setenv("COLUMNS", "97")
    assert make_console().width == 97 and make_console(wide=True).width == WIDE_WIDTH
    monkeypatch.delenv("COLUMNS")
    console = make_console()
    assert console.is_terminal or console.width == 80  # a pipe or a file: 80 columns


def test_json_is_the_summary_it_writes(parse, tmp_path, capsys):
    out = tmp_path / "plan"
    args = parse(plan_cli, "plan", "--model", "tiny", "--seq-len", "64", "--gpu", "T4", "--json", "--out", str(out))
    assert plan_cli.run(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((out / "summary.json").read_text())
    assert printed["schema"] == "ampkit.plan/1" and (out / "report.html").is_file()


def test_console_output_ends_with_the_recommendation_and_the_run_directory(parse, tmp_path, capsys):
    out = tmp_path / "plan"
    assert plan_cli.run(parse(plan_cli, "plan", "--model", "tiny", "--seq-len", "64", "--out", str(out))) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("Precision: ") for line in lines)
    assert lines[-1].startswith("run directory: ") and "summary.json, report.html" in lines[-1]
