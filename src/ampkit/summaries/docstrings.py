"""The attribute docstrings of this package's blocks (the string under `NAME = {...}`, read from the source
as Sphinx's autodoc reads them), by each block's identity: what a published JSON Schema says of an object
besides its types (`SummaryKind.json_schema`). A block documented once is described wherever it is used."""

from __future__ import annotations

import ast
import functools
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType


def documented_names(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(NAME, its docstring on one line) of each module-level `NAME = ...` followed by a string."""
    for node, after in zip(tree.body, tree.body[1:]):
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        text = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
        if isinstance(target, ast.Name) and isinstance(text, str):
            yield target.id, " ".join(text.split())


@functools.cache
def block_docs() -> Mapping[int, str]:
    """id(block) -> its docstring, for every documented dict block of `ampkit.summaries`' modules (imported
    here, at the first call: this module is imported by `kind.py`, which they import)."""
    docs = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"{__package__}.{path.stem}")
        for name, text in documented_names(ast.parse(path.read_text(encoding="utf-8"))):
            value = getattr(module, name, None)
            if isinstance(value, dict):  # a block: the kinds' objects (the other names are types, kinds, ids)
                docs[id(value)] = text
    return MappingProxyType(docs)
