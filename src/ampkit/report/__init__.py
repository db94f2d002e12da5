"""Reports: self-contained HTML pages with embedded plots, and Markdown twins.

`Report`, `as_stored` and `plt` load `ampkit.report.document` (and matplotlib, ~0.3 s) on first use,
so a command that only prints tables (`ampkit.report.console`) answers before matplotlib loads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampkit.report.document import Report, as_stored, plt

__all__ = ["Report", "as_stored", "plt"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ampkit.report import document

        return getattr(document, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
