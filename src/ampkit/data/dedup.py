"""Exact deduplication of training text (`--dedup exact`), before the train/val split.

Two texts are duplicates when their *normalized* forms are equal. Normalization collapses every
run of whitespace (spaces, tabs, newlines, and Unicode spaces) to one space and strips both ends;
nothing else changes. Case is kept on purpose: for a byte-level LM "Note" and "note" are different
training signal, and folding case would call them duplicates. Unicode is not NFC/NFKC-normalized
either: "exact" means the same characters up to layout.

The first occurrence (in corpus order) is kept, so the result is deterministic. Texts are compared
by a 128-bit BLAKE2b digest of the normalized UTF-8 bytes: memory is 16 bytes per distinct text,
and an accidental collision (probability ~n^2 / 2^129) is negligible for any corpus.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ampkit.errors import UsageError

DEDUP_MODES = ("none", "exact")
"""`--dedup` choices: "none" keeps everything; "exact" drops exact duplicates after normalization."""


@dataclass(frozen=True, kw_only=True)
class DedupStats:
    """What deduplication removed; tokens are counted with the run's tokenizer."""

    mode: str
    """"none" or "exact"."""
    level: str
    """What was compared: "paragraph" (the sampling unit) in the training pipeline."""
    items_before: int
    """Texts given."""
    items_removed: int
    """Duplicates dropped (every copy after the first)."""
    tokens_before: int
    """Tokens in all texts given."""
    tokens_removed: int
    """Tokens in the dropped texts: the training tokens dedup saved per epoch."""

    @property
    def items_after(self) -> int:
        return self.items_before - self.items_removed

    @property
    def tokens_removed_fraction(self) -> float:
        """Share of the tokens dedup removed (0.0 when there were none)."""
        return self.tokens_removed / self.tokens_before if self.tokens_before else 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for run summaries."""
        return {
            "mode": self.mode,
            "level": self.level,
            "items_before": self.items_before,
            "items_removed": self.items_removed,
            "items_after": self.items_after,
            "tokens_before": self.tokens_before,
            "tokens_removed": self.tokens_removed,
            "tokens_removed_fraction": self.tokens_removed_fraction,
        }


def normalize_text(text: str) -> str:
    """Whitespace runs -> one space, ends stripped (str.split() with no argument does both)."""
    return " ".join(text.split())


def text_key(text: str) -> bytes:
    """16-byte digest of the normalized text: equal keys <=> duplicates (up to a 2^-128 collision)."""
    return hashlib.blake2b(normalize_text(text).encode("utf-8"), digest_size=16).digest()


def dedup_exact(
    texts: Sequence[str], *, count_tokens: Callable[[str], int] = len, level: str = "paragraph"
) -> tuple[list[str], DedupStats]:
    """Keep the first copy of every normalized text, in the original order; count what was dropped.

    `count_tokens(text) -> int` measures a text in the run's tokens (default: characters).
    """
    seen: set[bytes] = set()
    kept: list[str] = []
    tokens_before = tokens_removed = removed = 0
    for text in texts:
        n = count_tokens(text)
        tokens_before += n
        key = text_key(text)
        if key in seen:
            removed += 1
            tokens_removed += n
            continue
        seen.add(key)
        kept.append(text)
    stats = DedupStats(
        mode="exact",
        level=level,
        items_before=len(texts),
        items_removed=removed,
        tokens_before=tokens_before,
        tokens_removed=tokens_removed,
    )
    return kept, stats


def dedup_indices(
    texts: Sequence[str], *, mode: str, sizes: Sequence[int], level: str = "paragraph"
) -> tuple[list[int], DedupStats]:
    """`apply_dedup` by position: the indices of the texts kept, `sizes[i]` the run's tokens in text i
    (already counted, so nothing is tokenized twice)."""
    if mode != "exact":
        check_dedup_mode(mode)
        return list(range(len(texts))), DedupStats(
            mode="none",
            level=level,
            items_before=len(texts),
            items_removed=0,
            tokens_before=sum(sizes),
            tokens_removed=0,
        )
    seen: set[bytes] = set()
    kept: list[int] = []
    for i, text in enumerate(texts):
        key = text_key(text)
        if key not in seen:
            seen.add(key)
            kept.append(i)
    removed = sum(sizes) - sum(sizes[i] for i in kept)
    stats = DedupStats(
        mode="exact",
        level=level,
        items_before=len(texts),
        items_removed=len(texts) - len(kept),
        tokens_before=sum(sizes),
        tokens_removed=removed,
    )
    return kept, stats


def apply_dedup(
    texts: Sequence[str], *, mode: str, count_tokens: Callable[[str], int] = len, level: str = "paragraph"
) -> tuple[list[str], DedupStats]:
    """Dispatch on `mode` ("none" counts tokens only, so reports show the same fields either way)."""
    check_dedup_mode(mode)
    if mode == "exact":
        return dedup_exact(texts, count_tokens=count_tokens, level=level)
    tokens = sum(count_tokens(t) for t in texts)
    return list(texts), DedupStats(
        mode="none", level=level, items_before=len(texts), items_removed=0, tokens_before=tokens, tokens_removed=0
    )


def check_dedup_mode(mode: str) -> None:
    if mode not in DEDUP_MODES:
        raise UsageError(f"unknown --dedup {mode!r}; choose one of: {', '.join(DEDUP_MODES)}")
