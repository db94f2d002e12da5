"""A small JSON Schema validator (the draft 2020-12 keywords `ampkit report --schema` exports: type,
properties, required, items, additionalProperties, anyOf, enum, const; `$schema`, `$id`, title and
description are annotations), written apart from `ampkit.summaries.spec.check` so a test of the export
does not grade it with the code it came from; and the published schemas (docs/schemas) to grade with.
No `jsonschema` dependency: it is not installed here, and these keywords are a page of code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PUBLISHED = Path(__file__).resolve().parents[1] / "docs" / "schemas"
"""Where the summary kinds' JSON Schemas are published (docs/schemas.md)."""


def published(kind) -> dict[str, Any]:
    """The JSON Schema of a summary kind (an `ampkit.summaries.SummaryKind`) as docs/schemas publishes it."""
    return json.loads((PUBLISHED / kind.schema_file).read_text(encoding="utf-8"))


_TYPES = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}
_ANNOTATIONS = {"$schema", "$id", "title", "description"}
_KNOWN = _ANNOTATIONS | {"type", "properties", "required", "items", "additionalProperties", "anyOf", "enum", "const"}


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _object_errors(value: dict, schema: dict, path: str) -> list[str]:
    errors = [f"{path}.{key}: required" for key in schema.get("required", []) if key not in value]
    properties = schema.get("properties", {})
    for key, item in value.items():
        if key in properties:
            errors += errors_of(item, properties[key], f"{path}.{key}")
        elif isinstance(schema.get("additionalProperties"), dict):
            errors += errors_of(item, schema["additionalProperties"], f"{path}.{key}")
    return errors


def errors_of(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every way `value` breaks `schema`, as "path: problem" ([] when it conforms)."""
    unknown = set(schema) - _KNOWN
    assert not unknown, f"{path}: keywords this validator does not know: {sorted(unknown)}"
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return [f"{path}: not {'/'.join(types)}: {value!r:.40}"]
    if "const" in schema and not _same(value, schema["const"]):
        return [f"{path}: not {schema['const']!r}"]
    if "enum" in schema and not any(_same(value, v) for v in schema["enum"]):
        return [f"{path}: not one of {schema['enum']!r}"]
    if "anyOf" in schema and all(errors_of(value, sub, path) for sub in schema["anyOf"]):
        return [f"{path}: matches none of anyOf"]
    if isinstance(value, dict):
        return _object_errors(value, schema, path)
    if isinstance(value, list) and "items" in schema:
        return [err for i, item in enumerate(value) for err in errors_of(item, schema["items"], f"{path}[{i}]")]
    return []
