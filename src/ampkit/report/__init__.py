"""Reports: self-contained HTML pages with embedded plots, and Markdown twins."""

from ampkit.report.document import Report, plt

__all__ = ["Report", "plt"]
