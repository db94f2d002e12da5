"""The shape of bench's `summary.json` ("ampkit.bench/2"): its typed record is `ampkit.summaries.BENCH`
(the ground layer, where every summary kind is defined); this module keeps bench's names for it.
docs/bench.md describes each field."""

from __future__ import annotations

from typing import Any

from ampkit.summaries.bench import BENCH
from ampkit.summaries.spec import Absent, ListOf, Opt, check

SUMMARY = BENCH.spec()
"""The whole document's spec (`ampkit.summaries.spec`)."""


def validate_summary(summary: Any) -> list[str]:
    """Problems with a bench summary: wrong schema/version/command, or fields of the wrong shape."""
    return BENCH.validate(summary)


__all__ = ["SUMMARY", "Absent", "ListOf", "Opt", "check", "validate_summary"]
