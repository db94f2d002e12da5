"""A report as a list of blocks, rendered to one self-contained HTML page and to Markdown.

Figures are matplotlib figures embedded as base64 PNG (`data:` URIs), so `report.html` opens
offline with nothing beside it; `report.md` references the same PNGs written next to it.
matplotlib runs with the non-interactive Agg backend (no display needed).

Every page opens with where its run came from (`ampkit.provenance`: date, ampkit and torch versions,
device, command line, resolved config), read from summary.json; nothing in a page comes from the
clock or the environment that renders it, and PNGs carry no metadata, so `ampkit report RUN_DIR`
re-renders a run's files byte for byte.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ampkit.config import dict_to_toml
from ampkit.runs import json_text, write_bytes_atomic, write_text_atomic

NOT_RECORDED = "not recorded"

_CSS = """
html{-webkit-text-size-adjust:100%}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222}
h1{border-bottom:2px solid #444;padding-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ccc}
h1,h2,p,figcaption,summary{overflow-wrap:break-word}
.scroll{overflow-x:auto;margin:1em 0}.scroll>table{margin:0}
table{border-collapse:collapse;margin:1em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}
.note{background:#f7f7ff;border-left:4px solid #66c;padding:.5em 1em}
.warn{background:#fff7e6;border-left:4px solid #e90;padding:.5em 1em}
figure{margin:1em 0}figcaption{color:#555;font-size:.9em}img{max-width:100%;height:auto}
table.provenance{font-size:.85em;color:#444}table.provenance td{text-align:left;overflow-wrap:anywhere}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.85em}
code,pre{font-family:ui-monospace,Menlo,Consolas,"DejaVu Sans Mono",monospace}
@media (max-width:600px){body{margin:1em auto;padding:0 .6em}h1{font-size:1.5em}table{font-size:.85em}}
"""
"""The page's style. It reads at a phone's width (390 CSS px) as at a desktop's: the viewport meta tag makes a
phone lay the page out at its own width, every table sits in a `.scroll` box that scrolls sideways by itself
(a bench's side-by-side table is ~1150 px wide) so the page never does, long words and paths wrap, no text is
smaller than 12 px (a font list, not bare `monospace`, whose default is 13 px, not 16), and figures shrink to the
column (tests/report/test_browser.py checks all three report kinds in Chromium)."""


@dataclass(frozen=True)
class _Heading:
    text: str


TextKind = Literal["text", "note", "warn"]


@dataclass(frozen=True)
class _Text:
    text: str
    kind: TextKind = "text"


@dataclass(frozen=True)
class _Table:
    headers: Sequence[object]
    rows: Sequence[Sequence[object]]


@dataclass(frozen=True)
class _Figure:
    png: bytes
    caption: str


@dataclass(frozen=True)
class _Code:
    text: str
    language: str = ""


_Block = _Heading | _Text | _Table | _Figure | _Code


@dataclass
class Report:
    """Build with add_* calls, then `write(run_dir)` -> report.html and report.md. `provenance`: the
    summary's "provenance" block (`ampkit.provenance`), shown under the title; None says "not recorded"."""

    title: str
    blocks: list[_Block] = field(default_factory=list)
    provenance: dict[str, Any] | None = None

    def heading(self, text: str) -> Report:
        self.blocks.append(_Heading(text))
        return self

    def text(self, text: str, *, kind: TextKind = "text") -> Report:
        """A paragraph; kind "note" or "warn" renders it highlighted."""
        self.blocks.append(_Text(text, kind))
        return self

    def table(self, headers: Sequence[object], rows: Sequence[Sequence[object]]) -> Report:
        self.blocks.append(_Table(headers, rows))
        return self

    def code(self, text: str, *, language: str = "") -> Report:
        """A preformatted block (code a reader copies: a torchao filter), lines kept as they are."""
        self.blocks.append(_Code(text, language))
        return self

    def figure(self, fig: Figure, caption: str = "") -> Report:
        """Takes ownership of a matplotlib figure (closed after rendering to PNG bytes)."""
        buf = io.BytesIO()
        # the same bytes on every render: no "Software" tag (matplotlib's version), a fixed dpi
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
        self.blocks.append(_Figure(buf.getvalue(), caption))
        return self

    def to_html(self) -> str:
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(self.title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(self.title)}</h1>",
            _html_provenance(self.provenance),
        ]
        for block in self.blocks:
            parts.append(_html_block(block))
        parts.append("</body></html>")
        return "\n".join(parts)

    def to_markdown(self, figure_names: list[str]) -> str:
        lines, figures = [f"# {self.title}", "", *_md_provenance(self.provenance), ""], iter(figure_names)
        for block in self.blocks:
            lines.extend(_md_block(block, figures))
            lines.append("")
        return "\n".join(lines)

    def write(self, run_dir: str | Path, *, stem: str = "report") -> tuple[Path, Path]:
        """Write `<stem>.html` (self-contained) and `<stem>.md` (+ its PNGs) into run_dir, each file
        atomically; a failure to write raises `ampkit.errors.WriteFailed` (the partial file removed)."""
        run_dir = Path(run_dir)
        names = []
        for i, block in enumerate(b for b in self.blocks if isinstance(b, _Figure)):
            name = f"{stem}-fig{i + 1}.png"
            write_bytes_atomic(run_dir / name, block.png)
            names.append(name)
        html_path, md_path = run_dir / f"{stem}.html", run_dir / f"{stem}.md"
        write_text_atomic(html_path, self.to_html())
        write_text_atomic(md_path, self.to_markdown(names))
        return html_path, md_path


def _html_block(block: _Block) -> str:
    if isinstance(block, _Heading):
        return f"<h2>{html.escape(block.text)}</h2>"
    if isinstance(block, _Text):
        cls = "" if block.kind == "text" else f" class='{block.kind}'"
        return f"<p{cls}>{html.escape(block.text)}</p>"
    if isinstance(block, _Table):
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in block.headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in block.rows)
        return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    if isinstance(block, _Code):
        return f"<pre><code>{html.escape(block.text)}</code></pre>"
    data = base64.b64encode(block.png).decode("ascii")
    return (
        f"<figure><img alt='{html.escape(block.caption)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{html.escape(block.caption)}</figcaption></figure>"
    )


def _md_cell(value: object) -> str:
    """A Markdown table cell: a literal '|' (as in '|grad| x scale') escaped so it does not split the cell,
    a newline folded to a space (a row is one line)."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _md_block(block: _Block, figures: Iterator[str]) -> list[str]:
    if isinstance(block, _Heading):
        return [f"## {block.text}"]
    if isinstance(block, _Text):
        return [str(block.text)] if block.kind == "text" else [f"> {block.text}"]
    if isinstance(block, _Table):
        out = ["| " + " | ".join(map(_md_cell, block.headers)) + " |", "|" + "---|" * len(block.headers)]
        out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
        return out
    if isinstance(block, _Code):
        return [f"```{block.language}", *block.text.splitlines(), "```"]
    return [f"![{block.caption}]({next(figures)})"]


def provenance_rows(provenance: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(field, value) lines of a run's header; every value "not recorded" for a summary without one."""
    p = provenance or {}

    def get(key: str) -> str:
        value = p.get(key)
        return NOT_RECORDED if value in (None, "") else str(value)

    return [
        ("created (UTC)", get("created_utc")),
        ("ampkit", get("ampkit_version")),
        ("torch", get("torch_version")),
        ("device", get("device")),
        ("command line", get("command_line")),  # None from the Python API
    ]


def _config_toml(provenance: dict[str, Any] | None) -> str | None:
    config = (provenance or {}).get("config")
    if not isinstance(config, dict):
        return None
    return dict_to_toml(config, heading="the run's resolved config: pass it back with --config FILE.toml")


def _command_note(provenance: dict[str, Any] | None) -> str:
    if not provenance:
        return "This run's summary predates the provenance block: date, versions and command line were not recorded."
    if provenance.get("command_line") is None:
        return "Run through the Python API (no command line); the resolved config below reproduces it."
    return "The command line, or the resolved config below with --config FILE.toml and a new --out, reproduces it."


def _html_provenance(provenance: dict[str, Any] | None) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{_code_html(v) if k == 'command line' else html.escape(v)}</td></tr>"
        for k, v in provenance_rows(provenance)
    )
    note = html.escape(_command_note(provenance))
    out = f"<div class='scroll'><table class='provenance'><tbody>{rows}</tbody></table></div><p class='note'>{note}</p>"
    toml = _config_toml(provenance)
    if toml is not None:
        out += f"<details><summary>resolved config (TOML)</summary><pre>{html.escape(toml)}</pre></details>"
    return out


def _code_html(value: str) -> str:
    return html.escape(value) if value == NOT_RECORDED else f"<code>{html.escape(value)}</code>"


def _md_provenance(provenance: dict[str, Any] | None) -> list[str]:
    lines = [
        f"- {k}: " + (f"`{v}`" if k == "command line" and v != NOT_RECORDED else v)
        for k, v in provenance_rows(provenance)
    ]
    lines += ["", f"> {_command_note(provenance)}"]
    toml = _config_toml(provenance)
    if toml is not None:
        lines += [
            "",
            "<details><summary>resolved config (TOML)</summary>",
            "",
            "```toml",
            toml.rstrip("\n"),
            "```",
            "",
            "</details>",
        ]
    return lines


def as_stored(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary as summary.json holds it (a JSON round trip: tuples become lists, Paths strings),
    so that a report written at run time and one `ampkit report` renders later read the same values."""
    return json.loads(json_text(summary))
