"""ampkit.summaries: one typed record per summary kind, found from a summary's schema id or the older form
of its kind, and a ground layer that imports no command package. (Each kind against a real run's summary:
tests/cli/test_report_roundtrip.py.)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import ampkit.summaries as summaries
from ampkit.summaries import BY_NAME, KINDS, find_kind, kind_of_summary, same_family
from ampkit.summaries.bench import BENCH
from ampkit.summaries.hw import HW
from ampkit.summaries.kind import Older
from ampkit.summaries.plan import PLAN, PLAN_LORA
from ampkit.summaries.train import TRAIN
from json_schema import errors_of


def test_every_kind_has_its_own_name_and_schema_id():
    assert len({k.name for k in KINDS}) == len({k.schema for k in KINDS}) == len(KINDS) == 13
    assert PLAN_LORA.schema == "ampkit.plan-lora/1" != PLAN.schema  # plan --lora: its own kind now


def test_the_ground_layer_imports_only_the_standard_library_and_itself():
    package = Path(summaries.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert name.startswith("ampkit.summaries") or top in sys.stdlib_module_names, f"{path.name}: {name}"


@pytest.mark.parametrize(
    ("summary", "kind"),
    [
        ({"schema": "ampkit.plan/1", "rows": []}, "plan"),
        ({"schema": "ampkit.plan/1", "methods": {}}, "plan-lora"),  # written before plan --lora had its own id
        ({"schema": "ampkit.plan-lora/1", "methods": {}}, "plan-lora"),
        ({"command": "train", "steps": 3}, "train"),  # train's summaries before they had a "schema"
        ({"command": "bench-sweep", "rows": []}, "bench-sweep"),
        ({"schema": "ampkit.train/1", "command": "train"}, "train"),
        ({"schema": "ampkit.hw/1"}, "hw"),
        ({"schema": "ampkit.data-stats/1"}, "data-stats"),
    ],
)
def test_a_summary_is_known_by_its_schema_id_or_its_kinds_older_form(summary, kind):
    assert kind_of_summary(summary) is BY_NAME[kind]


@pytest.mark.parametrize(
    "summary",
    [{"command": "plan"}, {"command": "bench"}, {"schema": "ampkit.bench/1"}, {"schema": None, "command": "train"}],
)
def test_what_no_kind_of_this_version_claims(summary):
    assert kind_of_summary(summary) is None


def test_another_versions_schema_is_named_by_its_family():
    assert same_family("ampkit.bench/1") is BENCH and same_family("ampkit.kv/7").name == "kv"
    assert same_family("other.bench/1") is None and same_family(None) is None


def test_a_kind_is_found_by_name_or_schema_id():
    assert find_kind("plan-lora") is find_kind("ampkit.plan-lora/1") is PLAN_LORA
    assert find_kind("ampkit.plan/1") is PLAN and find_kind("nope") is None


def test_validate_says_the_wrong_kind_first():
    errors = TRAIN.validate({"command": "bench", "schema": "ampkit.train/1"})
    assert errors[0] == "summary.command: expected 'train', got 'bench'" and "summary.steps: missing" in errors
    assert BENCH.validate([])[0] == "summary: expected an object, got list"


def test_an_older_form_accepts_its_old_id_and_a_missing_schema_only_where_it_had_none():
    assert PLAN_LORA.spec()["schema"].values == ("ampkit.plan-lora/1", "ampkit.plan/1")
    assert "schema" in PLAN_LORA.json_schema()["required"]
    assert "schema" not in TRAIN.json_schema()["required"]  # train's older summaries had no "schema"
    assert Older(schema=None, command="train").matches({"command": "train"})
    assert not Older(schema=None, command="train").matches({"command": "train", "schema": "x"})


def test_each_kinds_json_schema_is_a_document_with_its_id():
    for kind in KINDS:
        doc = kind.json_schema()
        assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema" and kind.schema in doc["title"]
        assert errors_of({"schema": kind.schema}, doc)  # the id alone is no summary
        assert errors_of({**dict.fromkeys(doc["required"]), "schema": "x"}, doc)


def test_hw_summary_minimal_document_passes_and_a_retyped_dtype_fails():
    summary = {
        "schema": "ampkit.hw/1",
        "command": "hw",
        "quick": True,
        "torch_version": "2",
        "cpu_threads": 2,
        "device": {
            "type": "cpu",
            "kind": "cpu",
            "name": "c",
            "total_memory_bytes": 1,
            "native_bf16": False,
            "native_fp16": False,
            "has_tf32": False,
            "has_fp8": False,
            "cpu_flags": [],
        },
        "dtypes": {},
    }
    assert HW.validate(summary) == [] and errors_of(summary, HW.json_schema()) == []
    broken = {**summary, "dtypes": {"bf16": {"native": "no"}}}
    assert "summary.dtypes.bf16.native: expected bool, got str 'no'" in HW.validate(broken)
    assert errors_of(broken, HW.json_schema())


def test_the_data_stats_record_is_its_kind_and_an_unknown_format_fails():
    from ampkit.data import ByteTokenizer
    from ampkit.data.stats import data_stats
    from ampkit.summaries.data import DATA_STATS

    summary = data_stats("default", tokenizer=ByteTokenizer(), seq_len=64, batch_size=2).to_dict()
    assert DATA_STATS.validate(summary) == [] and errors_of(summary, DATA_STATS.json_schema()) == []
    assert set(summary) == set(DATA_STATS.spec())  # every field the record has is typed
    broken = {**summary, "format": "csv", "length_histogram": [{"min": 1, "max": 2, "count": "3"}]}
    problems = DATA_STATS.validate(broken)
    assert any(p.startswith("summary.format: ") for p in problems)
    assert "summary.length_histogram[0].count: expected int, got str '3'" in problems
