"""Console tables that fit the terminal (80 columns by default) and never break a number or a word.

Every command's console output goes through this module:

- `make_console`: the terminal's width, else `COLUMNS`, else 80 (rich's default off a terminal); `--wide`
  gives a console wide enough that every column keeps its natural width (a terminal soft-wraps the rows).
- `compact_table`: a title line, a borderless table whose number and name columns never wrap
  (`no_wrap`: a cell is one line or the table is too wide, which the width tests catch), text columns that
  wrap between words only, and numbered footnotes below the table for notes too long for a cell.
- `key_value_table`: the two-column "field / value" view (model, device, doctor's findings, train's end).
- `column_format`: one number format per column (the decimals that give its smallest value enough
  significant digits), so a column never mixes "1.53e+03" with "191".

The full detail stays in summary.json and the HTML report; the console shows what a person decides on.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

WIDE_WIDTH = 400
"""--wide: columns enough for every table's natural width (the widest, bench's, needs about 200)"""


def console_width() -> int | None:
    """`COLUMNS` when it is a positive number, else None (rich then asks the terminal, or takes 80)."""
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def make_console(*, wide: bool = False, stderr: bool = False, width: int | None = None) -> Console:
    """The console a command prints its tables on: `width` if given; with `wide`, WIDE_WIDTH columns;
    else `COLUMNS`, else the terminal's width, else 80."""
    if width is None:
        width = WIDE_WIDTH if wide else console_width()
    return Console(width=width, stderr=stderr)


def print_run_dir(console: Console, run_dir: str | os.PathLike[str], files: str) -> None:
    """ "run directory: PATH (files)", the path never broken (a terminal soft-wraps a long one)."""
    console.print(f"run directory: {run_dir} ({files})", highlight=False, markup=False, soft_wrap=True)


@dataclass(frozen=True)
class Col:
    """One column: `numeric` ones are right-aligned; only `wrap` ones (statuses, notes) wrap, between words."""

    header: str
    numeric: bool = True
    wrap: bool = False


def name_col(header: str) -> Col:
    """A name column (precision, configuration): left-aligned, never wrapped."""
    return Col(header, numeric=False)


def note_col(header: str) -> Col:
    """A text column that may wrap between words (a status, a verdict)."""
    return Col(header, numeric=False, wrap=True)


def columns(headers: Sequence[str], *, names: int = 1, notes: int = 0) -> list[Col]:
    """The usual layout: the first `names` columns name the row, the last `notes` are text, the rest numbers."""
    return [
        name_col(h) if i < names else note_col(h) if i >= len(headers) - notes else Col(h)
        for i, h in enumerate(headers)
    ]


class Footnotes:
    """Notes too long for a cell: `ref(note)` gives its marker ("[1]"; the same note keeps its number),
    `lines()` the numbered notes to print below the table."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def ref(self, note: str | None) -> str:
        if not note:
            return ""
        number = self._numbers.setdefault(note, len(self._numbers) + 1)
        return f"[{number}]"

    def mark(self, cell: str, note: str | None) -> str:
        """`cell` with `note`'s marker appended ("healthy [2]"), or `cell` alone when there is no note."""
        marker = self.ref(note)
        return f"{cell} {marker}".strip() if marker else cell

    def lines(self) -> list[str]:
        return [f"[{number}] {note}" for note, number in self._numbers.items()]

    def __bool__(self) -> bool:
        return bool(self._numbers)


def table_of(
    columns: Sequence[Col],
    rows: Iterable[Sequence[str]],
    *,
    row_styles: Sequence[str | None] | None = None,
    show_header: bool = True,
) -> Table:
    """The borderless table itself: a rule under the header, two spaces between columns (one of padding,
    one of the box's blank divider)."""
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        show_header=show_header,
        header_style="bold",
    )
    for col in columns:
        table.add_column(
            col.header,
            justify="right" if col.numeric else "left",
            no_wrap=not col.wrap,
            overflow="fold" if col.wrap else "ellipsis",
        )
    for i, cells in enumerate(rows):
        style = row_styles[i] if row_styles is not None else None
        table.add_row(*(Text(str(cell)) for cell in cells), style=style)  # Text: a cell's brackets are not markup
    return table


def compact_table(
    title: str | None,
    columns: Sequence[Col],
    rows: Iterable[Sequence[str]],
    *,
    notes: Footnotes | Sequence[str] = (),
    row_styles: Sequence[str | None] | None = None,
    show_header: bool = True,
) -> Group:
    """A title line (wrapped between words at the console's width), the table, then the notes below it
    (a `Footnotes`' numbered lines, or plain lines)."""
    parts: list = [Text(title, style="bold")] if title else []
    parts.append(table_of(columns, rows, row_styles=row_styles, show_header=show_header))
    lines = notes.lines() if isinstance(notes, Footnotes) else list(notes)
    parts += [Text(line) for line in lines]
    return Group(*parts)


def key_value_table(title: str | None, rows: Iterable[tuple[str, str]], *, notes: Sequence[str] = ()) -> Group:
    """`field  value` lines: the field never wraps, the value wraps between words."""
    columns = [Col("field", numeric=False), Col("value", numeric=False, wrap=True)]
    return compact_table(title, columns, rows, notes=notes, show_header=False)


def labelled_lines(rows: Iterable[tuple[str, str]], *, indent: int = 3) -> Padding:
    """ "evidence: ..." lines under a heading: each text wraps between words with a hanging indent under
    itself, not under the label."""
    return Padding(table_of([Col("", numeric=False), note_col("")], rows, show_header=False), (0, 0, 0, indent))


# ---- one format per column ------------------------------------------------------------------------------


def decimals_for(values: Iterable[float | None], *, sig: int = 3, most: int = 2) -> int:
    """The decimals every cell of a column gets: enough for its smallest non-zero magnitude to show `sig`
    significant digits, at most `most` (191 -> 0; 0.38 -> 2; [1.0, 0.062] at sig 2 -> 3 if most allows)."""
    finite = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0]
    if not finite:
        return 0
    digits = math.floor(math.log10(min(finite))) + 1  # 191 -> 3, 5.1 -> 1, 0.38 -> 0, 0.062 -> -1
    return max(0, min(most, sig - digits))


def column_format(
    values: Sequence[float | None],
    *,
    sig: int = 3,
    most: int = 2,
    suffix: str = "",
    empty: str = "-",
    decimals: int | None = None,
) -> list[str]:
    """Each value with the column's one format (thousands separators, shared decimals, `suffix`);
    None (and non-finite values) as `empty`."""
    places = decimals_for(values, sig=sig, most=most) if decimals is None else decimals
    return [empty if v is None or not math.isfinite(v) else f"{v:,.{places}f}{suffix}" for v in values]


TIME_UNITS = (("us", 1e-6), ("ms", 1e-3), ("s", 1.0))


def time_unit(seconds: Iterable[float | None]) -> tuple[str, float]:
    """One unit for a column of durations: the largest in which its smallest value is at least 1."""
    known = [s for s in seconds if s is not None and math.isfinite(s) and s > 0]
    if not known:
        return "ms", 1e-3
    smallest = min(known)
    unit = TIME_UNITS[0]
    for candidate in TIME_UNITS:
        if smallest >= candidate[1]:
            unit = candidate
    return unit
