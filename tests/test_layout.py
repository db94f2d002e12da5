"""The test tree mirrors the source tree, and no module of `src/ampkit` goes untested.

- Every module under src/ampkit is imported by at least one test module (a `tests/**/test_*.py`
  file), as `import ampkit.x.y` or `from ampkit.x.y import ...` (or `from ampkit.x import y` where
  `y` is the module). A package counts as imported when a test imports it or any module inside it
  (that runs its `__init__`). Read from the files' text with `ast`: nothing is imported here.
- Every test directory is the mirror of a package: tests/<pkg>/ for src/ampkit/<pkg>/, nested alike,
  unless it is a cross-cutting directory listed below with its reason.
- The layers docs/architecture.md states are the layers import-linter's contract checks (pyproject.toml).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ampkit"
TESTS = ROOT / "tests"

UNTESTED_FOR_NOW: set[str] = set()
"""Modules no test imports yet, each with its reason; the test fails once one is imported (remove it then)."""

CROSS_CUTTING_DIRS = {
    # End-to-end behaviour of every command under hostile inputs, kills and signals: no one package.
    "reliability": "hostile inputs, kill/resume and signal tests across all commands",
    # Not tests: a sitecustomize.py that the distributed tests put on the launched ranks' PYTHONPATH.
    "distributed/inject": "fault-injection hook loaded by torchrun workers (tests/distributed)",
}


def source_modules() -> set[str]:
    """Dotted names of every module and package under src/ampkit."""
    names = set()
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.add(".".join(parts))
    return names


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def imported_names(source: str) -> set[str]:
    """`a.b.c` for `import a.b.c`; `a.b` and `a.b.c` for `from a.b import c` (c may be a module);
    anywhere in the file (imports inside functions too); relative imports are not ampkit's."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def untested_modules() -> set[str]:
    imported = set().union(*(imported_names(path.read_text(encoding="utf-8")) for path in _test_files()))
    return {
        module
        for module in source_modules()
        if module not in imported and not any(name.startswith(module + ".") for name in imported)
    }


def test_every_source_module_is_imported_by_a_test():
    missing = untested_modules() - UNTESTED_FOR_NOW
    assert not missing, f"no test module imports: {', '.join(sorted(missing))} (add tests in the mirrored directory)"


def test_the_exceptions_are_still_needed():
    assert source_modules() >= UNTESTED_FOR_NOW, "an exception names a module that no longer exists"
    tested_now = UNTESTED_FOR_NOW - untested_modules()
    assert not tested_now, f"now imported by a test, remove from UNTESTED_FOR_NOW: {', '.join(sorted(tested_now))}"


def test_every_test_directory_mirrors_a_package():
    packages = {str(path.parent.relative_to(SRC)) for path in SRC.rglob("__init__.py")} - {"."}
    directories = {
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*")
        if path.is_dir() and path.name != "__pycache__" and not path.name.startswith(".")
    }
    strays = directories - packages - set(CROSS_CUTTING_DIRS)
    assert not strays, f"test directories without a src/ampkit package: {', '.join(sorted(strays))}"
    assert set(CROSS_CUTTING_DIRS) <= directories, "a listed cross-cutting directory no longer exists"


def test_the_import_reader_sees_every_form():
    source = (
        "import ampkit.cli.kv as kv_cli\n"
        "from ampkit.hardware import device\n"
        "from . import helpers\n"
        "def test_x():\n"
        "    import ampkit.__main__\n"
    )
    assert imported_names(source) == {"ampkit.cli.kv", "ampkit.hardware", "ampkit.hardware.device", "ampkit.__main__"}


def _documented_layers() -> list[str]:
    """The fenced block under docs/architecture.md's "Layers" heading, one layer a line."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Layers and the direction of imports", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL)
    assert block, "docs/architecture.md's Layers section has no fenced block of layers"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_documented_layers_are_the_contracts_layers():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"][
        "contracts"
    ]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c.get("containers") == ["ampkit"]]
    assert layers["exhaustive"], "the contract must name every top-level module (exhaustive = true)"
    assert _documented_layers() == layers["layers"]
