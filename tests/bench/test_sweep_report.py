"""ampkit.bench.sweep: the sweep's table and report from its summary alone, and the name check."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ampkit.bench.sweep import render_sweep_report, sweep_names_ok, sweep_table
from ampkit.errors import UsageError


def _row(variant: str, tokens_per_s: float, ratio: float) -> dict:
    return {
        "variant": variant,
        "status": "ok",
        "tokens_per_s": tokens_per_s,
        "step_ms_median": 40.0,
        "padding_fraction": 0.25 if variant == "baseline" else 0.01,
        "peak_memory_bytes": 300 * 2**20,
        "vs_baseline": {"tokens_per_s": ratio, "memory": 1.0},
    }


def _summary() -> dict:
    skipped = {"variant": "compile", "status": "skipped", "error": "torch.compile needs a C compiler"}
    return {
        "precision": "fp32",
        "device": {"type": "cpu", "name": "test cpu"},
        "fastest": "pack",
        "rows": [_row("baseline", 1000.0, 1.0), _row("pack", 1300.0, 1.3), skipped],
    }


def test_table_shows_ratios_and_skipped_rows():
    out = io.StringIO()
    Console(file=out, width=160).print(sweep_table(_summary()))
    text = out.getvalue()
    assert "1,300" in text and "1.30x" in text and "25.0%" in text and "300" in text and "peak MiB" in text
    assert "compile" in text and "skipped" in text


def test_report_names_the_fastest_and_why_a_row_was_skipped(tmp_path):
    html_path, md_path = render_sweep_report(_summary(), tmp_path)
    html = html_path.read_text()
    assert "Fastest: pack." in html and "compile: skipped: torch.compile needs a C compiler" in html
    assert "data:image/png;base64" in html
    row = "| pack | ok | 1,300 | 1,300 | 1.30x | 40 | 1.0% | 300 |"  # trained, then processed (none masked)
    assert row in md_path.read_text()


def test_sweep_names_are_checked_before_anything_runs():
    sweep_names_ok("")
    sweep_names_ok("all")
    with pytest.raises(UsageError):
        sweep_names_ok("turbo")
