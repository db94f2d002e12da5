"""ampkit.bench.report: report.html and report.md of a bench run, from its summary.json alone."""

from __future__ import annotations

import json

from ampkit.bench.report import build_report, render_report


def test_the_report_is_rebuilt_byte_for_byte_from_the_summary(real_runs, tmp_path):
    run = real_runs["bench"]  # bench --precisions fp32,bf16-mixed on the tiny model (tests/helpers.py)
    summary = json.loads((run.run_dir / "summary.json").read_text())
    html, md = render_report(summary, tmp_path)
    assert html.read_bytes() == (run.run_dir / "report.html").read_bytes()
    assert md.read_bytes() == (run.run_dir / "report.md").read_bytes()
    text = md.read_text()
    for heading in ("Setup", "Side by side", "Fidelity against fp32", "Loss curves", "Step time", "Memory"):
        assert f"## {heading}" in text, heading


def test_a_run_where_nothing_ran_says_why_and_draws_nothing(real_runs, tmp_path):
    summary = json.loads((real_runs["bench"].run_dir / "summary.json").read_text())
    for entry in summary["precisions"]:
        entry.update(status="failed", error="out of memory")
    _, md = build_report(summary).write(tmp_path)
    text = md.read_text()
    assert "fp32 failed: out of memory" in text and "## Loss curves" not in text
    assert not list(tmp_path.rglob("*.png"))
