"""What a module converter did to a model: the Linears it converted, those it kept and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampkit.errors import UsageError


class ConversionRefused(UsageError):
    """A precision's converter cannot convert this model (no Linear meets its format's shape rule, or
    the model's code does not survive the converted layers): one line with the fix. `plan` reports the
    other precisions and names this one as refused; every other command stops with exit code 2."""


@dataclass(frozen=True, kw_only=True)
class ConversionReport:
    """One `convert` of a model by a format's converter."""

    precision: str
    """the precision that converted it ("mxfp8-emulated")"""
    format: str
    """the numeric format of the converted Linears (`ampkit.formats`: "mxfp8")"""
    emulated: bool
    """the converted Linears round in software (fidelity, not speed)"""
    converted: list[str] = field(default_factory=list)
    """the converted Linears' module names, in model order"""
    kept: dict[str, str] = field(default_factory=dict)
    """module name -> why that Linear stays in the compute dtype (bf16 under autocast)"""

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "format": self.format,
            "emulated": self.emulated,
            "converted": list(self.converted),
            "kept": dict(self.kept),
        }

    def note(self, *, limit: int = 3) -> str:
        """One line for the console: "mxfp8-emulated: 28 of 29 Linears in mxfp8; kept in bf16: lm_head
        (the output head)"; the first `limit` kept layers are named, the rest counted."""
        total = len(self.converted) + len(self.kept)
        text = f"{self.precision}: {len(self.converted)} of {total} Linears in {self.format}"
        if self.emulated:
            text += " (emulated: fidelity, not speed)"
        if not self.kept:
            return text
        named = [f"{name} ({why})" for name, why in list(self.kept.items())[:limit]]
        more = len(self.kept) - len(named)
        return text + "; kept in bf16: " + ", ".join(named) + (f" and {more} more" if more else "")
