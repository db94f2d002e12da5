"""The shape language of summary.json records, checked without any schema library, and its JSON Schema.

A spec is a Python type (or tuple of types), `Opt(spec)` for "may be null", `ListOf(spec)`,
`MapOf(spec)` (an object of any keys, each value `spec`), `OneOf(*values)` (one of these exact
values), or a dict of key -> spec: every key required unless its spec is `Absent(spec)`, "may be
missing" (a field added within a schema version, which older summaries lack). Extra keys are allowed,
so adding a field is not a breaking change; removing or retyping one is, and bumps the schema version.

`check(value, spec)` lists the mismatches as one-line "path: problem" strings; `json_schema(spec)` is
the same shape as a JSON Schema (draft 2020-12) fragment, for consumers outside Python, its fields
described by the units their names state and its objects by the blocks' docstrings it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Opt:
    """The value may be null; when it is not, `spec` applies."""

    spec: Any


@dataclass(frozen=True)
class ListOf:
    """A list whose every item is `spec`."""

    spec: Any


@dataclass(frozen=True)
class MapOf:
    """An object whose keys are free (precision names, dtype keys) and whose every value is `spec`."""

    spec: Any


@dataclass(frozen=True)
class Absent:
    """A key that may be missing (added within the schema version); when present, `spec` applies."""

    spec: Any


@dataclass(frozen=True, init=False)
class OneOf:
    """Exactly one of `values` (strings or integers: a status, a schema id, a version)."""

    values: tuple[Any, ...]

    def __init__(self, *values: Any):
        object.__setattr__(self, "values", values)


NUM = (int, float)
OPT_NUM = Opt(NUM)


def _type_ok(value: Any, types: Any) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:  # bool is an int subclass: not a number here
        return False
    return isinstance(value, types)


def _check_dict(value: Any, spec: dict[str, Any], path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected an object, got {type(value).__name__}"]
    errors = [f"{path}.{key}: missing" for key, sub in spec.items() if key not in value and not isinstance(sub, Absent)]
    present = [(key, sub) for key, sub in spec.items() if key in value]
    return errors + [err for key, sub in present for err in check(value[key], sub, f"{path}.{key}")]


def check(value: Any, spec: Any, path: str = "summary") -> list[str]:
    """Every mismatch between `value` and `spec`, as "path: problem" lines ([] when it conforms)."""
    if isinstance(spec, Absent):
        return check(value, spec.spec, path)
    if isinstance(spec, Opt):
        return [] if value is None else check(value, spec.spec, path)
    if isinstance(spec, ListOf):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [err for i, item in enumerate(value) for err in check(item, spec.spec, f"{path}[{i}]")]
    if isinstance(spec, MapOf):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        return [err for key, item in value.items() for err in check(item, spec.spec, f"{path}.{key}")]
    if isinstance(spec, OneOf):
        if any(type(value) is type(v) and value == v for v in spec.values):
            return []
        wanted = ", ".join(repr(v) for v in spec.values)
        return [f"{path}: expected {'one of ' if len(spec.values) > 1 else ''}{wanted}, got {value!r:.40}"]
    if isinstance(spec, dict):
        return _check_dict(value, spec, path)
    if not _type_ok(value, spec):
        wanted = "/".join(t.__name__ for t in (spec if isinstance(spec, tuple) else (spec,)))
        return [f"{path}: expected {wanted}, got {type(value).__name__} {value!r:.40}"]
    return []


_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object", list: "array"}


def _json_type(spec: Any) -> dict[str, Any]:
    types = spec if isinstance(spec, tuple) else (spec,)
    names = [_JSON_TYPES[t] for t in types]
    if "number" in names and "integer" in names:  # JSON's number includes its integers
        names.remove("integer")
    return {"type": names[0] if len(names) == 1 else names}


UNITS = (
    ("_per_s", "per second"),
    ("_bytes", "bytes"),
    ("_gib", "GiB (1024**3 bytes)"),
    ("_ms", "milliseconds"),
    ("_s", "seconds"),
)
"""A field's unit from the end of its name (names carry units: `wall_s`, `peak_bytes`), first match wins."""


def unit_of(key: str) -> str | None:
    """The unit `key`'s name states (`UNITS`), or None."""
    return next((unit for suffix, unit in UNITS if key.endswith(suffix)), None)


def _properties(spec: dict[str, Any], blocks: Mapping[int, str]) -> dict[str, Any]:
    properties = {}
    for key, sub in spec.items():
        fragment = json_schema(sub, blocks)
        unit = unit_of(key)
        properties[key] = {"description": f"unit: {unit}", **fragment} if unit else fragment
    return properties


def json_schema(spec: Any, blocks: Mapping[int, str] = MappingProxyType({})) -> dict[str, Any]:
    """`spec` as a JSON Schema fragment: the same required keys, types, nulls, lists and values. A field
    whose name states its unit (`unit_of`) says it, and an object whose spec is one of `blocks` (by
    identity: `id(spec)` -> text) is described by it."""
    if isinstance(spec, Absent):
        return json_schema(spec.spec, blocks)
    if isinstance(spec, Opt):
        return {"anyOf": [json_schema(spec.spec, blocks), {"type": "null"}]}
    if isinstance(spec, ListOf):
        return {"type": "array", "items": json_schema(spec.spec, blocks)}
    if isinstance(spec, MapOf):
        return {"type": "object", "additionalProperties": json_schema(spec.spec, blocks)}
    if isinstance(spec, OneOf):
        return {"const": spec.values[0]} if len(spec.values) == 1 else {"enum": list(spec.values)}
    if isinstance(spec, dict):
        described = {"description": blocks[id(spec)]} if id(spec) in blocks else {}
        return {
            **described,
            "type": "object",
            "properties": _properties(spec, blocks),
            "required": [key for key, sub in spec.items() if not isinstance(sub, Absent)],
        }
    return _json_type(spec)
