"""docs/architecture.md names every module of src/ampkit, so its layout table stays true as modules come.

The layout table has one row per top-level module (`api.py`) or package (`plan/`), and a package's row
names its modules inside backticks. A module counts as named when:
- a top-level module (`records.py`): it has its own row, or a top-level module's row names it (`api.py`'s
  row names `doctor.py`);
- a module of a package (`plan/ledger.py`, `plan/describe/hf.py`): its package's row names it in a code
  span, by its file name (`ledger.py`), its path inside the package (`describe/hf.py`) or its full path
  (`plan/describe/hf.py`), so a row may group a subpackage's files however it reads best;
- a package's `__init__.py`: a top-level package by its row; a subpackage (`plan/describe/`) by its
  folder in its package's row (`describe/`), or by one of its modules named by path (`describe/hf.py`).
ampkit's own `__init__.py` and `__main__.py` are the package itself (`python -m ampkit`): no row.
Read from the files' text: nothing is imported here.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ampkit"
DOC = ROOT / "docs" / "architecture.md"

THE_PACKAGE_ITSELF = {"__init__.py", "__main__.py"}
"""src/ampkit's own package files: the whole table describes them."""

_CODE_SPAN = re.compile(r"`([^`]+)`")


def layout_rows(text: str) -> dict[str, set[str]]:
    """The layout table's rows: the first cell (`plan/`, `api.py`) -> the code spans of the whole row."""
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = line.split("|")
        if not line.startswith("|") or len(cells) < 3:
            continue
        key = cells[1].strip().strip("`")
        if key in ("module", "---"):  # the header and its rule
            continue
        rows[key] = set(_CODE_SPAN.findall(line))
    return rows


def source_files(src: Path = SRC) -> set[str]:
    """Every .py file under src/ampkit, as a path relative to it (`plan/ledger.py`, `api.py`)."""
    return {path.relative_to(src).as_posix() for path in src.rglob("*.py")}


def is_named(module: str, rows: dict[str, set[str]]) -> bool:
    path = PurePosixPath(module)
    if len(path.parts) == 1:  # a top-level module
        if module in THE_PACKAGE_ITSELF or module in rows:
            return True
        return any(module in spans for key, spans in rows.items() if key.endswith(".py"))
    package, inside = path.parts[0], PurePosixPath(*path.parts[1:])
    spans = rows.get(f"{package}/")
    if spans is None:
        return False
    if path.name == "__init__.py":
        if len(inside.parts) == 1:  # the package's own: its row
            return True
        folder = inside.parent.as_posix()
        folder_names = {folder, f"{folder}/", f"{package}/{folder}", f"{package}/{folder}/"}
        return bool(spans & folder_names) or any(span.startswith(f"{folder}/") for span in spans)
    return bool(spans & {path.name, inside.as_posix(), module})


def unnamed_modules(text: str, modules: set[str]) -> set[str]:
    rows = layout_rows(text)
    return {module for module in modules if not is_named(module, rows)}


def test_every_module_is_named_in_the_architecture_doc():
    missing = unnamed_modules(DOC.read_text(encoding="utf-8"), source_files())
    assert not missing, (
        f"docs/architecture.md's layout table does not name: {', '.join(sorted(missing))} "
        "(add each to its package's row, or give a top-level module its row)"
    )


def test_every_row_is_a_module_or_package_that_exists():
    files = source_files()
    stale = {
        key
        for key in layout_rows(DOC.read_text(encoding="utf-8"))
        if (f"{key}__init__.py" if key.endswith("/") else key) not in files
    }
    assert not stale, f"docs/architecture.md has rows for what src/ampkit no longer has: {', '.join(sorted(stale))}"


TABLE = """# Architecture

## Layout (`src/ampkit/`)

| module | concern |
| --- | --- |
| `api.py` | the API; `doctor.py`: doctor's |
| `plan/` | `ledger.py` (analytic: `replay.py`); `describe/`: `hf.py`; `traced/trace.py`; `render/` |
| `cli/` | `report.py`: `ampkit report` |

## Checkpoints

`step.py` (outside the table: names nothing)
"""


def test_the_table_reader_accepts_every_way_a_row_names_a_module():
    named = {
        "api.py",
        "doctor.py",
        "__main__.py",
        "plan/__init__.py",
        "plan/ledger.py",
        "plan/replay.py",
        "plan/describe/__init__.py",  # its folder named
        "plan/describe/hf.py",  # its file name
        "plan/traced/__init__.py",  # a module named by its path inside the package
        "plan/traced/trace.py",
        "plan/render/__init__.py",
        "cli/report.py",
    }
    unnamed = {
        "records.py",  # no row; `report.py` in cli's row is cli's
        "report.py",  # a package row's file is that package's, not a top-level module
        "plan/fp8_plan.py",
        "plan/kv/__init__.py",
        "core/step.py",  # named only outside the table, and core has no row
    }
    assert unnamed_modules(TABLE, named | unnamed) == unnamed
