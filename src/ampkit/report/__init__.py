"""Reports: self-contained HTML pages with embedded plots, and Markdown twins."""

from ampkit.report.document import Report, as_stored, plt

__all__ = ["Report", "as_stored", "plt"]
