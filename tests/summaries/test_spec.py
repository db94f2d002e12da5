"""ampkit.summaries.spec: `check` names every mismatch by its path in one line, and `json_schema` is the
same shape as a JSON Schema (graded by tests/json_schema.py, an independent validator)."""

from __future__ import annotations

import pytest

from ampkit.summaries.spec import NUM, Absent, ListOf, MapOf, OneOf, Opt, check, json_schema
from json_schema import errors_of

SPEC = {
    "status": OneOf("ok", "failed"),
    "version": OneOf(2),
    "rate": NUM,
    "note": Opt(str),
    "rows": ListOf({"name": str, "bytes": int}),
    "dtypes": MapOf({"native": bool}),
    "added_later": Absent(int),
}
GOOD = {
    "status": "ok",
    "version": 2,
    "rate": 1.5,
    "note": None,
    "rows": [{"name": "a", "bytes": 3}],
    "dtypes": {"fp32": {"native": True}, "bf16": {"native": False}},
}
BROKEN = [
    ({"status": "slow"}, "summary.status: expected one of 'ok', 'failed', got 'slow'"),
    ({"version": True}, "summary.version: expected 2, got True"),  # a bool is no version, though True == 1
    ({"rate": "fast"}, "summary.rate: expected int/float, got str 'fast'"),
    ({"rate": False}, "summary.rate: expected int/float, got bool False"),
    ({"note": 3}, "summary.note: expected str, got int 3"),
    ({"rows": [{"name": "a"}]}, "summary.rows[0].bytes: missing"),
    ({"dtypes": {"fp16": {"native": "yes"}}}, "summary.dtypes.fp16.native: expected bool, got str 'yes'"),
    ({"added_later": 1.5}, "summary.added_later: expected int, got float 1.5"),
]


def test_a_conforming_document_passes_both_checks():
    assert check(GOOD, SPEC) == []
    assert errors_of(GOOD, json_schema(SPEC)) == []
    assert check({**GOOD, "extra": 1, "added_later": 3}, SPEC) == []  # extra keys: a field added later


@pytest.mark.parametrize(("change", "problem"), BROKEN)
def test_each_broken_field_is_one_line_from_check_and_refused_by_the_json_schema(change, problem):
    broken = {**GOOD, **change}
    assert check(broken, SPEC) == [problem]
    assert errors_of(broken, json_schema(SPEC)) != []


def test_a_missing_required_key_is_named_and_an_absent_one_is_not():
    without = {k: v for k, v in GOOD.items() if k != "rate"}
    assert check(without, SPEC) == ["summary.rate: missing"]
    assert errors_of(without, json_schema(SPEC)) == ["$.rate: required"]
    assert "added_later" not in json_schema(SPEC)["required"]


def test_the_json_schema_keywords():
    assert json_schema(OneOf("x")) == {"const": "x"}
    assert json_schema(OneOf("x", "y")) == {"enum": ["x", "y"]}
    assert json_schema(NUM) == {"type": "number"}
    assert json_schema(Opt(int)) == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert json_schema(MapOf(str)) == {"type": "object", "additionalProperties": {"type": "string"}}
    assert json_schema(ListOf(bool)) == {"type": "array", "items": {"type": "boolean"}}


def test_a_field_says_the_unit_its_name_states_and_a_documented_block_its_text():
    block = {"wall_s": NUM, "items_per_s": NUM, "peak_bytes": int, "total_gib": NUM, "step_ms": ListOf(NUM)}
    block["steps"] = int  # no unit in its name: no description
    schema = json_schema({"timing": Opt(block), "other": {"x": int}}, {id(block): "one run's timing"})
    timing = schema["properties"]["timing"]["anyOf"][0]
    assert timing["description"] == "one run's timing" and "description" not in schema["properties"]["other"]
    assert {key: field.get("description") for key, field in timing["properties"].items()} == {
        "wall_s": "unit: seconds",
        "items_per_s": "unit: per second",
        "peak_bytes": "unit: bytes",
        "total_gib": "unit: GiB (1024**3 bytes)",
        "step_ms": "unit: milliseconds",
        "steps": None,
    }
    assert errors_of({"timing": None, "other": {"x": 1}}, schema) == []  # descriptions are annotations only
