"""The shape of `summary.json` ("ampkit.bench/2"), checked without any schema library.

A spec is a Python type (or tuple of types), `Opt(spec)` for "may be null", `ListOf(spec)`, or a
dict of key -> spec (every key required unless its spec is `Absent(spec)`, "may be missing": a field
added within version 2, which older summaries lack; extra keys allowed, so adding a field is not a
breaking change -- removing or retyping one is, and bumps SCHEMA_VERSION). docs/bench.md describes
each field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ampkit.bench.summary import SCHEMA, SCHEMA_VERSION


@dataclass(frozen=True)
class Opt:
    spec: Any


@dataclass(frozen=True)
class ListOf:
    spec: Any


@dataclass(frozen=True)
class Absent:
    """A key that may be missing (added within the schema version); when present, `spec` applies."""

    spec: Any


NUM = (int, float)
OPT_NUM = Opt(NUM)

TIMING = {
    "items_per_s": NUM,
    "items_per_s_all": NUM,
    "measured_s": NUM,
    "step_ms_median": NUM,
    "step_ms_p10": NUM,
    "step_ms_p90": NUM,
    "step_ms_min": NUM,
    "step_ms_max": NUM,
    "step_ms": ListOf(NUM),
}
MEMORY = {
    "kind": str,
    "peak_bytes": int,
    "run_bytes": int,
    "step_peak_bytes": Absent(Opt(int)),
    "predicted_bytes": Absent(Opt(int)),
    "predicted_source": Absent(Opt(str)),
    "predicted_note": Absent(Opt(str)),
    "predicted_ratio": Absent(OPT_NUM),
}
SHARES = {key: NUM for key in ("matmul", "norm", "elementwise", "casts", "optimizer", "data", "other")}
PROFILE = {
    "step_ms": NUM,
    "ms": SHARES,
    "shares": SHARES,
    "top_ops": ListOf(list),
    "matmul_ratio": Absent(OPT_NUM),
    "amdahl_speedup": Absent(OPT_NUM),
}
BUDGET_ENTRY = {
    "mode": str,
    "few_steps": bool,
    "reason": Opt(str),
    "batch_size": Opt(int),
    "warmup_steps": Opt(int),
    "fidelity_rows": Opt(int),
    "estimated_step_s": OPT_NUM,
    "measured_step_s": OPT_NUM,
    "estimated_total_s": OPT_NUM,
    "max_measure_s": OPT_NUM,
    "measured_s": NUM,
}
FIDELITY = {
    "logits_cosine": OPT_NUM,
    "logits_max_abs_diff": OPT_NUM,
    "loss": OPT_NUM,
    "loss_diff": OPT_NUM,
    "grad_cosine": OPT_NUM,
    "grad_elements": int,
    "verdict": str,
    "passed": bool,
    "loss_curve": {"steps_compared": int, "max_gap": OPT_NUM, "mean_gap": OPT_NUM, "final_gap": OPT_NUM},
    "rows": Absent(int),
}
PRECISION = {
    "name": str,
    "status": str,
    "error": Opt(str),
    "native": bool,
    "native_note": str,
    "steps": Opt({"warmup": int, "measured": int, "stalled": int}),
    "timing": Opt(TIMING),
    "mfu": Opt(
        {"value": OPT_NUM, "peak_flops": OPT_NUM, "peak_source": str, "peak_dtype": str, "note": Absent(Opt(str))}
    ),
    "memory": Opt(MEMORY),
    "loss": Opt(
        {
            "first": OPT_NUM,
            "final": OPT_NUM,
            "last": OPT_NUM,
            "curve": ListOf(OPT_NUM),
            "at_common_step": Absent(OPT_NUM),
        }
    ),
    "stability": Opt(
        {
            "stable": bool,
            "reason": Opt(str),
            "skipped_steps": int,
            "nonfinite_loss_steps": int,
            "nonfinite_grad_steps": int,
            "final_loss_scale": OPT_NUM,
        }
    ),
    "vs_fp32": Opt({"speedup": NUM, "steps_compared": int, "memory_ratio": NUM, "same_batches": Absent(bool)}),
    "fidelity": Opt(FIDELITY),
    "files": {"result": str, "log": str, "fidelity": Opt(str)},
    "budget": Absent(Opt(BUDGET_ENTRY)),
    "profile": Absent(Opt(PROFILE)),
}
TRAIN = {
    "command": str,
    "batch_size": int,
    "batch_source": Opt(str),
    "batch_note": Opt(str),
    "expected_items_per_s": OPT_NUM,
    "measured_batch_size": Opt(int),
}
# `ampkit.provenance`: where the run came from (the report's header reads it; added within version 2)
PROVENANCE = {
    "created_utc": str,
    "ampkit_version": str,
    "torch_version": Opt(str),
    "device": str,
    "command_line": Opt(str),
    "config": Opt(dict),
}
SUMMARY = {
    "schema": str,
    "schema_version": int,
    "command": str,
    "status": Absent(str),
    "interrupted": Absent(Opt({"signal": str, "during": Opt(str), "finished": ListOf(str)})),
    "ampkit_version": str,
    "torch_version": str,
    "created_utc": str,
    "wall_s": NUM,
    "config": dict,
    "host_load": Opt({"cpus": int, "start": Opt(ListOf(NUM)), "end": Opt(ListOf(NUM))}),
    "device": {
        "type": str,
        "name": str,
        "gpu_model": Opt(str),
        "compute_capability": Opt(ListOf(int)),
        "total_memory_bytes": int,
        "native_bf16": bool,
        "native_fp16": bool,
        "has_tf32": bool,
        "has_fp8": bool,
        "cpu_flags": ListOf(str),
        "cpu_threads": int,
    },
    "unit": str,
    "task": {"name": str, "unit": str},
    "model": {
        "preset": str,
        "parameters": Opt(int),
        "flops_per_item": OPT_NUM,
        "flops_source": Opt(str),
        "flops_formula": Opt(str),
    },
    "data": {"corpus": Opt(str), "seq_len": Opt(int), "batch_size": int},
    "reference": str,
    "warnings": ListOf(str),
    "loss_common_step": Absent(Opt(int)),
    "profile": Absent(
        Opt(
            {
                "categories": dict,
                "reference_matmul_share": NUM,
                "ceiling_2x": NUM,
                "ceiling_unbounded": OPT_NUM,
                "cast_threshold": NUM,
            }
        )
    ),
    "peaks": Absent(Opt(dict)),
    "provenance": Absent(PROVENANCE),
    "budget": Absent(
        Opt(
            {
                "budget_s": NUM,
                "timed_precisions": int,
                "measured_s": NUM,
                "fidelity_s": NUM,
                "startup_s": NUM,
                "expected_s": OPT_NUM,
                "wall_s": NUM,
                "bound_s": OPT_NUM,
                "within_bound": Opt(bool),
            }
        )
    ),
    "precisions": ListOf(PRECISION),
    "recommendation": {
        "precision": Opt(str),
        "reason": str,
        "disqualified": dict,
        "advice": ListOf(str),
        "train": Absent(Opt(TRAIN)),
    },
}


def _type_ok(value: Any, types: Any) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:  # bool is an int subclass: not a number here
        return False
    return isinstance(value, types)


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
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        errors = [
            f"{path}.{key}: missing" for key, sub in spec.items() if key not in value and not isinstance(sub, Absent)
        ]
        return errors + [
            err for key, sub in spec.items() if key in value for err in check(value[key], sub, f"{path}.{key}")
        ]
    if not _type_ok(value, spec):
        wanted = "/".join(t.__name__ for t in (spec if isinstance(spec, tuple) else (spec,)))
        return [f"{path}: expected {wanted}, got {type(value).__name__} {value!r:.40}"]
    return []


STATUSES = ("completed", "interrupted")
"""summary["status"]: every precision ran, or a stop signal ended the bench after the ones listed
(a summary marked "failed" by a write error is no bench summary: it lacks the rest)."""
PRECISION_STATUSES = ("ok", "failed", "not-timed", "interrupted")


def validate_summary(summary: Any) -> list[str]:
    """Problems with a bench summary: wrong schema/version/command, or fields of the wrong shape."""
    errors = check(summary, SUMMARY)
    if isinstance(summary, dict):
        if summary.get("status", "completed") not in STATUSES:
            errors.append(f"summary.status: expected one of {', '.join(STATUSES)}, got {summary.get('status')!r}")
        for i, entry in enumerate(summary.get("precisions") or []):
            if isinstance(entry, dict) and entry.get("status") not in PRECISION_STATUSES:
                errors.append(
                    f"summary.precisions[{i}].status: expected one of {', '.join(PRECISION_STATUSES)}, "
                    f"got {entry.get('status')!r}"
                )
        if summary.get("schema") != SCHEMA or summary.get("schema_version") != SCHEMA_VERSION:
            errors.insert(
                0,
                f"summary.schema: expected {SCHEMA} (version {SCHEMA_VERSION}), got "
                f"{summary.get('schema')!r} (version {summary.get('schema_version')!r})",
            )
        if summary.get("command") != "bench":
            errors.insert(0, f"summary.command: expected 'bench', got {summary.get('command')!r}")
    return errors
