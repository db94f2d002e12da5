"""The summary validator catches what a consumer of summary.json would trip over."""

from __future__ import annotations

import copy

from ampkit.bench.schema import ListOf, Opt, check, validate_summary


def test_check_reports_paths_and_types():
    spec = {"a": int, "b": Opt(str), "c": ListOf({"x": (int, float)})}
    assert check({"a": 1, "b": None, "c": [{"x": 1.5}]}, spec) == []
    errors = check({"a": True, "c": [{"x": "no"}, {}]}, spec)
    assert "summary.a: expected int, got bool True" in errors
    assert "summary.b: missing" in errors
    assert any(e.startswith("summary.c[0].x: expected int/float") for e in errors)
    assert "summary.c[1].x: missing" in errors


def test_validate_summary_flags_wrong_schema_and_shape():
    assert validate_summary({"command": "train"})[0].startswith("summary.command: expected 'bench'")
    errors = validate_summary({"command": "bench", "schema": "ampkit.bench/1", "schema_version": 1})
    assert errors[:2] == [
        "summary.schema: expected 'ampkit.bench/2', got 'ampkit.bench/1'",
        "summary.schema_version: expected 2, got 1",
    ]
    assert "summary.precisions: missing" in errors


def test_a_minimal_conforming_summary_passes_and_a_retyped_field_fails():
    entry = {
        "name": "fp32",
        "status": "failed",
        "error": "x",
        "native": True,
        "native_note": "native",
        "steps": None,
        "timing": None,
        "mfu": None,
        "memory": None,
        "loss": None,
        "stability": None,
        "vs_fp32": None,
        "fidelity": None,
        "files": {"result": "r", "log": "l", "fidelity": None},
    }
    summary = {
        "schema": "ampkit.bench/2",
        "schema_version": 2,
        "command": "bench",
        "ampkit_version": "0",
        "torch_version": "2",
        "created_utc": "t",
        "wall_s": 1.0,
        "config": {},
        "host_load": None,
        "device": {
            "type": "cpu",
            "name": "c",
            "gpu_model": None,
            "compute_capability": None,
            "total_memory_bytes": 1,
            "native_bf16": False,
            "native_fp16": False,
            "has_tf32": False,
            "has_fp8": False,
            "cpu_flags": [],
            "cpu_threads": 2,
        },
        "unit": "tokens",
        "task": {"name": "tiny", "unit": "tokens"},
        "model": {
            "preset": "tiny",
            "parameters": 1,
            "flops_per_item": 6.0,
            "flops_source": "analytic",
            "flops_formula": "6N",
        },
        "data": {"corpus": "c", "seq_len": 8, "batch_size": 2},
        "reference": "fp32",
        "warnings": [],
        "precisions": [entry],
        "recommendation": {"precision": None, "reason": "r", "disqualified": {}, "advice": []},
    }
    assert validate_summary(summary) == []
    broken = copy.deepcopy(summary)
    broken["precisions"][0]["timing"] = {"items_per_s": "fast"}
    assert any(
        e.startswith("summary.precisions[0].timing.items_per_s: expected int/float") for e in validate_summary(broken)
    )
