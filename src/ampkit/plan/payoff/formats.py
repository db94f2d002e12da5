"""`--formats`: which numeric formats the payoff predictor prices, each with its recipe.

A list item is a registry format name or alias (`ampkit.formats`), optionally `:recipe` (the fp8
recipes: `fp8:rowwise`); `all` is every format with a matmul peak in the GPU table except bf16 (the
baseline) and fp8-e5m2 (priced as e4m3: the same bytes at the same peak), fp8 at its default recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.errors import UsageError
from ampkit.formats import FORMATS, get_format
from ampkit.hardware.roofline import BASELINE, quantization, recipes_of

ALL = "all"
SAME_PRICE_AS = {"fp8-e5m2": "fp8-e4m3"}
"""Formats `all` leaves out: priced exactly as the named one."""
FLAG = "--formats"


@dataclass(frozen=True)
class Candidate:
    """One format at one recipe."""

    format: str
    """the registry name"""
    recipe: str

    @property
    def label(self) -> str:
        """How tables name it: the format's table key ("fp8"), then ":recipe" when not its default."""
        fmt = get_format(self.format)
        short = fmt.key if fmt.name == "fp8-e4m3" else fmt.name
        default = quantization(self.format).name
        return short if self.recipe == default else f"{short}:{self.recipe}"

    def to_dict(self) -> dict:
        return {"format": self.format, "recipe": self.recipe, "label": self.label}


def all_candidates() -> list[Candidate]:
    return [
        Candidate(f.name, quantization(f.name).name)
        for f in FORMATS.values()
        if f.peak_key is not None and f.name != BASELINE and f.name not in SAME_PRICE_AS
    ]


def parse_formats(text: str) -> list[Candidate]:
    """`--formats`'s list as candidates, in order, each once; a bad item is refused in one line."""
    items = [part.strip().lower() for part in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"{FLAG} {text!r} has an empty item; give a comma-separated list of formats, or 'all'")
    out: list[Candidate] = []
    for item in items:
        for candidate in all_candidates() if item == ALL else [_candidate(item)]:
            if candidate not in out:
                out.append(candidate)
    return out


def _candidate(item: str) -> Candidate:
    name, _, recipe = item.partition(":")
    fmt = get_format(name, flag=FLAG)
    if fmt.peak_key is None:
        priced = ", ".join(c.label for c in all_candidates())
        raise UsageError(
            f"{FLAG}: {fmt.name} has no matmul peak in the GPU table (a storage format: {fmt.about}); "
            f"the predictor prices GEMMs: choose from {priced}"
        )
    recipes = recipes_of(fmt.name)
    if recipe and recipe not in recipes:
        raise UsageError(f"{FLAG}: {fmt.name} has no recipe {recipe!r}; choose from {', '.join(recipes)}")
    return Candidate(fmt.name, recipe or recipes[0])
