"""ampkit.report.document: one report, rendered to a self-contained HTML page and to Markdown."""

from __future__ import annotations

import base64

from ampkit.report import Report, plt
from ampkit.report.document import Report as DocumentReport


def _report() -> Report:
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    return (
        Report("bf16 <vs> fp32")
        .heading("Summary")
        .text("plain & simple")
        .text("a note", kind="note")
        .text("a warning", kind="warn")
        .table(["precision", "tokens/s"], [["fp32", 100], ["bf16-mixed", 1.5]])
        .figure(fig, caption="speed")
    )


def test_the_package_exports_the_document_report():
    assert Report is DocumentReport


def test_html_is_self_contained_and_escaped(tmp_path):
    html_path, md_path = _report().write(tmp_path)
    html = html_path.read_text(encoding="utf-8")
    assert "<title>bf16 &lt;vs&gt; fp32</title>" in html and "<h2>Summary</h2>" in html
    assert "<p>plain &amp; simple</p>" in html
    assert "<p class='note'>a note</p>" in html and "<p class='warn'>a warning</p>" in html
    assert "<th>precision</th><th>tokens/s</th>" in html and "<td>bf16-mixed</td><td>1.5</td>" in html
    encoded = html.split("data:image/png;base64,")[1].split("'")[0]
    assert base64.b64decode(encoded) == (tmp_path / "report-fig1.png").read_bytes()  # the same PNG, inline
    assert "<figcaption>speed</figcaption>" in html


def test_markdown_references_the_png_written_beside_it(tmp_path):
    _, md_path = _report().write(tmp_path, stem="bench")
    md = md_path.read_text(encoding="utf-8").splitlines()
    assert md[0] == "# bf16 <vs> fp32"
    assert "## Summary" in md and "plain & simple" in md and "> a note" in md and "> a warning" in md
    assert "| precision | tokens/s |" in md and "|---|---|" in md and "| fp32 | 100 |" in md
    assert "![speed](bench-fig1.png)" in md
    assert (tmp_path / "bench-fig1.png").read_bytes().startswith(b"\x89PNG")


def test_figures_are_closed_once_rendered():
    fig, _ = plt.subplots()
    number = fig.number
    Report("r").figure(fig)
    assert number not in plt.get_fignums()
