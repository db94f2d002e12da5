"""ampkit.report.document: one report, rendered to a self-contained HTML page and to Markdown."""

from __future__ import annotations

import base64

from ampkit.report import Report, as_stored, plt
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
    html_path, _md_path = _report().write(tmp_path)
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


PROVENANCE = {
    "created_utc": "2026-01-02T03:04:05Z",
    "ampkit_version": "9.9.9",
    "torch_version": "2.99.0",
    "device": "NVIDIA H200 (cuda:0, 139.8 GiB)",
    "command_line": "ampkit bench --out 'runs/a b'",
    "config": {"budget_s": 5.0, "task": "", "lora": {"lora": 0, "lora_targets": ""}},
}


def test_the_header_shows_where_the_run_came_from(tmp_path):
    html_path, md_path = Report("r", provenance=PROVENANCE).write(tmp_path)
    html = html_path.read_text(encoding="utf-8")
    for value in ("2026-01-02T03:04:05Z", "9.9.9", "2.99.0", "NVIDIA H200 (cuda:0, 139.8 GiB)"):
        assert f"<td>{value}</td>" in html
    assert "<code>ampkit bench --out &#x27;runs/a b&#x27;</code>" in html
    assert "<pre># the run&#x27;s resolved config" in html and "budget_s = 5.0" in html and "[lora]" in html
    md = md_path.read_text(encoding="utf-8")
    assert "- command line: `ampkit bench --out 'runs/a b'`" in md and "```toml" in md


def test_a_summary_without_provenance_says_not_recorded(tmp_path):
    _, md_path = Report("old").write(tmp_path)
    md = md_path.read_text(encoding="utf-8")
    assert "- created (UTC): not recorded" in md and "- command line: not recorded" in md
    assert "predates the provenance block" in md and "```toml" not in md


def test_the_python_api_has_no_command_line(tmp_path):
    _, md_path = Report("api", provenance=PROVENANCE | {"command_line": None}).write(tmp_path)
    assert "Run through the Python API" in md_path.read_text(encoding="utf-8")


def test_pngs_are_the_same_bytes_every_time(tmp_path):
    def png() -> bytes:
        fig, ax = plt.subplots()
        ax.plot([0, 1, 2], [2, 0, 1])
        return Report("r").figure(fig).blocks[0].png

    first = png()
    assert png() == first and b"Software" not in first  # no matplotlib version tag


def test_as_stored_is_what_summary_json_reads_back(tmp_path):
    from pathlib import Path

    assert as_stored({"a": (1, 2), "p": Path("x/y"), "n": float("inf")}) == {"a": [1, 2], "p": "x/y", "n": float("inf")}


def test_a_page_is_laid_out_at_a_phones_width_with_its_tables_in_scroll_boxes(tmp_path):
    """Without a browser (tests/report/test_browser.py checks the layout in Chromium): a phone lays the page out at
    its own width (the viewport meta tag; else at 980 px, shrunk), and every table, the header's too, sits alone in
    a box that scrolls sideways by itself, so a wide table never makes the page scroll."""
    html_path, _ = Report("r", provenance=PROVENANCE).table(["a"], [[1]]).write(tmp_path)
    html = html_path.read_text(encoding="utf-8")
    head = html.split("</head>")[0]
    assert "<meta name='viewport' content='width=device-width, initial-scale=1'>" in head
    assert ".scroll{overflow-x:auto;" in head
    tables = html.count("<table")
    assert tables == 2 and html.count("<div class='scroll'><table") == tables
    assert html.count("</table></div>") == tables


def test_a_pipe_in_a_markdown_cell_does_not_split_it(tmp_path):
    """'|grad| x scale' in a cell is one cell (an escaped pipe), the row keeps its column count."""
    report = Report("t").table(["check", "max"], [["|grad| x scale", "7e4\nover fp16"]])
    _, md_path = report.write(tmp_path)
    row = next(line for line in md_path.read_text(encoding="utf-8").splitlines() if "grad" in line)
    assert row == "| \\|grad\\| x scale | 7e4 over fp16 |"
    assert len(row.replace("\\|", "").split("|")) - 2 == 2  # two cells between the outer pipes
