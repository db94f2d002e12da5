"""ampkit inside other training loops: a callback for the Hugging Face `transformers.Trainer`
(`ampkit.integrations.transformers.AmpkitCallback`) and one for Lightning
(`ampkit.integrations.lightning.AmpkitCallback`), both driving one framework-neutral monitor
(`session.Monitor`) and writing an ampkit run directory ("ampkit.callback/1": summary.json,
metrics.jsonl, report.html; `report.py`). docs/integrations.md.

Nothing here imports transformers or lightning until its own module is imported.
"""

from ampkit.integrations.session import AmpkitWarning, Monitor, MonitorSettings, Subject

__all__ = ["AmpkitWarning", "Monitor", "MonitorSettings", "Subject"]
