"""docs/schemas: every summary kind's JSON Schema as published is what `ampkit report --schema all --out
docs/schemas` writes from the typed records now, and the summary.json of a real run of every kind (the
suite's shared `REAL_RUNS`) is valid against its published file, a broken one not. Graded by
tests/json_schema.py, a validator written apart from ampkit's own."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ampkit.cli.report import REGENERATE
from ampkit.summaries import BY_NAME, KINDS
from ampkit.summaries.kind import JSON_SCHEMA_DIALECT
from helpers import REAL_RUNS
from json_schema import PUBLISHED, errors_of, published

ROOT = Path(__file__).resolve().parents[2]

REAL = {
    "bench": "bench",
    "bench-lora": "bench",
    "bench-inference": "bench-inference",
    "sweep": "bench-sweep",
    "train": "train",
    "doctor": "doctor",  # doctor --from's replay: tests/diagnostics/test_replay.py validates a real one
    "plan": "plan",
    "plan-lora": "plan-lora",
    "plan-task": "plan-task",
    "kv": "kv",
    "kv-from-bench": "kv-measured",
    "hw": "hw",
    "data-stats": "data-stats",
}
"""A shared real run (tests/helpers.py REAL_RUNS) -> the kind of the summary it writes."""
ELSEWHERE = {"callback": "tests/integrations/test_transformers.py"}
"""Kinds no ampkit command writes (a transformers or Lightning run's), validated against their published file
where such a run is made."""


def _texts(folder: Path) -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.schema.json"))}


def test_the_published_schemas_are_what_the_typed_records_generate(run_cli, tmp_path):
    code, out, err = run_cli("report", "--schema", "all", "--out", str(tmp_path))
    assert code == 0, err
    assert out.splitlines() == [f"wrote {tmp_path / kind.schema_file}" for kind in KINDS]
    generated, on_disk = _texts(tmp_path), _texts(PUBLISHED)
    changed = sorted(name for name in generated.keys() & on_disk.keys() if generated[name] != on_disk[name])
    missing, stale = sorted(generated.keys() - on_disk.keys()), sorted(on_disk.keys() - generated.keys())
    assert not (changed or missing or stale), (
        f"docs/schemas differs from what ampkit.summaries generates (changed: {changed}, missing: {missing}, "
        f"no kind's, to delete: {stale}); regenerate it with `{REGENERATE}`"
    )


def test_each_published_file_names_its_dialect_and_its_kinds_schema_id():
    assert REGENERATE == "python -m ampkit report --schema all --out docs/schemas"
    assert f"`{REGENERATE}`" in (ROOT / "docs" / "schemas.md").read_text(encoding="utf-8")
    for kind in KINDS:
        schema = published(kind)
        assert schema["$schema"] == JSON_SCHEMA_DIALECT and schema["$id"] == kind.schema
        assert schema["title"].startswith(f"{kind.schema}: ") and schema["type"] == "object"
        assert errors_of({}, schema)[0] == f"$.{schema['required'][0]}: required"  # and its keywords are known


def test_every_kind_has_a_shared_real_run():
    assert set(REAL.values()) | set(ELSEWHERE) == set(BY_NAME) and set(REAL) <= set(REAL_RUNS)
    for kind, test in ELSEWHERE.items():
        assert f"published({kind.upper()})" in (ROOT / test).read_text(encoding="utf-8")


def _summary(real_runs, name: str) -> dict:
    return json.loads((real_runs[name].run_dir / "summary.json").read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REAL))
def test_a_real_summary_is_valid_against_its_published_schema(real_runs, name):
    summary = _summary(real_runs, name)
    schema = published(BY_NAME[REAL[name]])
    assert summary["schema"] == schema["$id"]
    assert errors_of(summary, schema) == []


def _retyped(summary: dict, schema: dict) -> tuple[dict, str]:
    """A copy of `summary` whose first required field of one plain JSON type holds another type; its key."""
    key = next(k for k in schema["required"] if isinstance(schema["properties"][k].get("type"), str))
    broken = copy.deepcopy(summary)
    broken[key] = 7 if schema["properties"][key]["type"] != "integer" else "seven"
    return broken, key


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bench", "train", "doctor", "plan-lora", "kv-from-bench", "data-stats"])
def test_a_broken_summary_is_refused_by_its_published_schema(real_runs, name):
    summary = _summary(real_runs, name)
    schema = published(BY_NAME[REAL[name]])
    other = next(kind.schema for kind in KINDS if kind.schema != summary["schema"])
    [wrong_id] = errors_of({**summary, "schema": other}, schema)  # one problem: "not 'ampkit.bench/2'", "not one of"
    assert wrong_id.startswith("$.schema: not ") and repr(summary["schema"]) in wrong_id
    retyped, key = _retyped(summary, schema)
    assert [e.split(":")[0] for e in errors_of(retyped, schema)] == [f"$.{key}"]
    missing = {k: v for k, v in summary.items() if k != key}
    assert errors_of(missing, schema) == [f"$.{key}: required"]
    nested = copy.deepcopy(summary)
    path = _drop_a_nested_required_field(nested, schema)
    assert errors_of(nested, schema) == [f"{path}: required"]


def _drop_a_nested_required_field(summary: dict, schema: dict) -> str:
    """Remove, in place, the first required field of the first required object field (or of the first item
    of the first required list of objects) that has one; its path."""
    for key in schema["required"]:
        sub, value = schema["properties"][key], summary.get(key)
        if sub.get("type") == "array" and value:
            sub, value, key = sub["items"], value[0], f"{key}[0]"
        if sub.get("type") == "object" and sub.get("required") and isinstance(value, dict):
            del value[sub["required"][0]]
            return f"$.{key}.{sub['required'][0]}"
    raise AssertionError("no required object field with required fields of its own")
