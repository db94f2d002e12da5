"""The token account: what a batch's loss covers, what the model read, and what the hardware computed.

    trained     items with a loss: target tokens outside masks and padding (a language model under
                --train-on completion: the answers' tokens), samples for a classifier. The loss is the
                mean over them, so gradient accumulation weights micro-batches by them.
    processed   items the model read: trained plus masked ones (a prompt), padding excluded. MFU and
                "processed tokens/s" count them: the FLOPs were spent on them, trained or not.
    slots       everything computed, padding included (B * T for a padded LM batch).
    image_tokens
                the processed items that stand for images in a vision-language model's sequence (its
                image tokens: a LLaVA image is 576 of them, an mllama image one): read, never trained.
                The text tokens read are processed - image_tokens.
    trained <= processed <= slots, image_tokens <= processed - trained. More kinds are new fields
    with a default of 0.

A task's `count(batch)` returns a `Counts`; a user task's older `(items, slots)` tuple still works:
`as_counts` reads it as trained = processed = items (no masks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Counts:
    """One batch's (or one step's) token account, host ints (module docstring)."""

    trained: int
    processed: int
    slots: int
    image_tokens: int = 0

    def __iter__(self) -> Iterator[int]:
        """Unpacks as the older `(items, slots)` pair (`items, slots = task.count(batch)`), so code
        written before the account keeps working."""
        return iter((self.trained, self.slots))

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})


NO_COUNTS = Counts(trained=0, processed=0, slots=0)


def as_counts(value: Any) -> Counts:
    """A task's `count(batch)` as `Counts`: a Counts as it is, an `(items, slots)` pair as
    trained = processed = items (tasks written before the token account)."""
    if isinstance(value, Counts):
        return value
    items, slots = value
    return Counts(trained=items, processed=items, slots=slots)


def sum_counts(counts: Any) -> Counts:
    """The sum of several counts (any mix of `Counts` and pairs)."""
    out = NO_COUNTS
    for value in counts:
        out = out + as_counts(value)
    return out
