"""Every kind of summary.json ampkit writes, each a typed record (`SummaryKind`: its schema id, how its
older summaries are recognised, its fields and their types, its validator and its JSON Schema).

The ground layer: it imports no command package. `ampkit report` finds a run's kind here
(`kind_of_summary`) and renders it with the renderer registered for that kind (`cli/report.py`).
A summary writer's "schema" value is its kind's `schema` (tests check each against a real run).
"""

from __future__ import annotations

from typing import Any

from ampkit.summaries.bench import BENCH, INFERENCE, SWEEP
from ampkit.summaries.callback import CALLBACK
from ampkit.summaries.data import DATA_STATS
from ampkit.summaries.hw import HW
from ampkit.summaries.kind import Older, SummaryKind
from ampkit.summaries.plan import KV, KV_MEASURED, PLAN, PLAN_LORA, PLAN_TASK
from ampkit.summaries.train import DOCTOR, TRAIN

KINDS: tuple[SummaryKind, ...] = (
    BENCH,
    INFERENCE,
    SWEEP,
    TRAIN,
    DOCTOR,
    PLAN,
    PLAN_LORA,
    PLAN_TASK,
    KV,
    KV_MEASURED,
    HW,
    DATA_STATS,
    CALLBACK,
)
"""Every kind, once: their names and schema ids are distinct (tests/summaries check it)."""

BY_NAME: dict[str, SummaryKind] = {kind.name: kind for kind in KINDS}


def kind_of_summary(summary: dict[str, Any]) -> SummaryKind | None:
    """The kind of `summary`: the kind whose older form it has (plan --lora before its own id carried
    plan's id), else the kind whose schema id it carries; None when no kind of this version is its."""
    for kind in KINDS:
        if kind.recognises_older(summary):
            return kind
    return next((kind for kind in KINDS if kind.schema == summary.get("schema")), None)


def same_family(schema: Any) -> SummaryKind | None:
    """The kind of this version whose family `schema` belongs to (`ampkit.bench/1` -> bench's), or None."""
    if not isinstance(schema, str):
        return None
    return next((kind for kind in KINDS if kind.family == schema.split("/")[0]), None)


def find_kind(name: str) -> SummaryKind | None:
    """A kind by its name (`plan-lora`) or its schema id (`ampkit.plan-lora/1`)."""
    return BY_NAME.get(name) or next((kind for kind in KINDS if kind.schema == name), None)


__all__ = ["BY_NAME", "KINDS", "Older", "SummaryKind", "find_kind", "kind_of_summary", "same_family"]
