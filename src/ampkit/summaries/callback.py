"""The summary kind of a framework callback's run ("ampkit.callback/1"): a Hugging Face `Trainer` or a
Lightning `Trainer` watched by `ampkit.integrations` (docs/integrations.md). The curves (loss, loss
scale, gradient statistics) are in the run's metrics.jsonl, which the report reads beside it."""

from __future__ import annotations

from ampkit.summaries.kind import PROVENANCE, WARNINGS, SummaryKind
from ampkit.summaries.spec import NUM, OPT_NUM, ListOf, OneOf, Opt

FINDING = {"kind": str, "module": str, "cls": str, "phase": str, "site": str, "step": int, "values": str}
"""`diagnostics.locator.Finding.to_dict` (its explanation and frame ring too)."""

CALLBACK = SummaryKind(
    name="callback",
    schema="ampkit.callback/1",
    title="ampkit's callback: a transformers or Lightning training run monitored",
    fields={
        "command": OneOf("callback"),
        "ampkit_version": str,
        "provenance": PROVENANCE,
        # "stopped": Lightning's on_exception (a KeyboardInterrupt included); "failed": a write failed
        "status": OneOf("completed", "stopped", "failed"),
        "error": Opt(str),
        "framework": {"name": OneOf("transformers", "lightning"), "version": str},
        "settings": {"locator": OneOf("off", "auto", "on"), "grad_stats_every": int, "log_every": int, "inject": str},
        "device": {"type": str, "name": str},
        "precision": str,
        "warnings": WARNINGS,
        "model": {"cls": str, "inspected": bool, "parameters": Opt(int), "trainable": Opt(int)},
        "steps": int,
        "skipped_steps": int,
        "first_loss": OPT_NUM,
        "final_loss": OPT_NUM,
        "final_loss_scale": OPT_NUM,
        "locator": {
            "armed_at": Opt(int),
            "first_nonfinite": Opt(FINDING),
            "near_limits": ListOf(dict),
        },
        "scale": {"active": bool, "skipped": int, "points": ListOf({"step": int, "scale": OPT_NUM, "skipped": bool})},
        "inject": Opt({"spec": str, "fired_steps": ListOf(int)}),
        "frozen_layers": ListOf(dict),
        "wall_s": NUM,
    },
)
