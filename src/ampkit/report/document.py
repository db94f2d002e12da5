"""A report as a list of blocks, rendered to one self-contained HTML page and to Markdown.

Figures are matplotlib figures embedded as base64 PNG (`data:` URIs), so `report.html` opens
offline with nothing beside it; `report.md` references the same PNGs written next to it.
matplotlib runs with the non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib.figure import Figure  # noqa: E402

from ampkit.runs import write_bytes_atomic, write_text_atomic  # noqa: E402

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222}
h1{border-bottom:2px solid #444;padding-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:1em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}
.note{background:#f7f7ff;border-left:4px solid #66c;padding:.5em 1em}
.warn{background:#fff7e6;border-left:4px solid #e90;padding:.5em 1em}
figure{margin:1em 0}figcaption{color:#555;font-size:.9em}img{max-width:100%}
"""


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


_Block = _Heading | _Text | _Table | _Figure


@dataclass
class Report:
    """Build with add_* calls, then `write(run_dir)` -> report.html and report.md."""

    title: str
    blocks: list[_Block] = field(default_factory=list)

    def heading(self, text: str) -> "Report":
        self.blocks.append(_Heading(text))
        return self

    def text(self, text: str, *, kind: TextKind = "text") -> "Report":
        """A paragraph; kind "note" or "warn" renders it highlighted."""
        self.blocks.append(_Text(text, kind))
        return self

    def table(self, headers: Sequence[object], rows: Sequence[Sequence[object]]) -> "Report":
        self.blocks.append(_Table(headers, rows))
        return self

    def figure(self, fig: Figure, caption: str = "") -> "Report":
        """Takes ownership of a matplotlib figure (closed after rendering to PNG bytes)."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.blocks.append(_Figure(buf.getvalue(), caption))
        return self

    def to_html(self) -> str:
        parts = [
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(self.title)}</h1>"
        ]
        for block in self.blocks:
            parts.append(_html_block(block))
        parts.append("</body></html>")
        return "\n".join(parts)

    def to_markdown(self, figure_names: list[str]) -> str:
        lines, figures = [f"# {self.title}", ""], iter(figure_names)
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
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    data = base64.b64encode(block.png).decode("ascii")
    return (
        f"<figure><img alt='{html.escape(block.caption)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{html.escape(block.caption)}</figcaption></figure>"
    )


def _md_block(block: _Block, figures: Iterator[str]) -> list[str]:
    if isinstance(block, _Heading):
        return [f"## {block.text}"]
    if isinstance(block, _Text):
        return [str(block.text)] if block.kind == "text" else [f"> {block.text}"]
    if isinstance(block, _Table):
        out = ["| " + " | ".join(map(str, block.headers)) + " |", "|" + "---|" * len(block.headers)]
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in block.rows]
        return out
    return [f"![{block.caption}]({next(figures)})"]
