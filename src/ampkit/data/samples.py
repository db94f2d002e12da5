"""A *sample*: one piece of training text and the character spans that carry a loss, tokenized once.

Every data format becomes samples before tokenization: a paragraph of a text corpus is a sample
trained everywhere (`spans=None`); a chat conversation or a prompt/completion pair, rendered to text
(`ampkit.data.chat`), is a sample whose `spans` are its assistant turns or its completion. Encoding
turns the spans into per-token labels: a token carries a loss iff its characters overlap a span (a
byte-level BPE token " four" that starts with the prompt's space still holds answer text), else its
label is IGNORE_INDEX (-100, the loss skips it). The label of token t is what the model is trained
to predict at position t - 1 (`ampkit.data.batching`: targets are the labels shifted by one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ampkit.data.batching import IGNORE_INDEX
from ampkit.data.tokenizer import Tokenizer
from ampkit.errors import UsageError

TRAIN_ON = ("auto", "completion", "all")
"""`--train-on`: which tokens carry a loss. completion: the assistant turns / completions only (the
default for instruction data); all: every token; auto: completion for instruction data, all for text."""

Span = tuple[int, int]
"""[start, end) in characters of a sample's text."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One training text and where its loss is."""

    text: str
    """The text the model reads (a paragraph, or a conversation rendered by its chat template)."""
    spans: tuple[Span, ...] | None = None
    """Character spans that carry a loss, sorted and disjoint; None: every token does."""
    where: str = ""
    """Where it came from, for messages: "FILE line N" (empty for a text corpus's paragraphs)."""


@dataclass(frozen=True)
class Encoded:
    """A sample's token ids and labels (1-D LongTensors of one length)."""

    ids: torch.Tensor
    labels: torch.Tensor
    """`ids` itself (the same tensor: no copy) when every token carries a loss; else IGNORE_INDEX
    where the loss is skipped."""


def check_train_on(value: str) -> str:
    if value not in TRAIN_ON:
        raise UsageError(f"unknown --train-on {value!r}; choose one of: {', '.join(TRAIN_ON)}")
    return value


def encode_sample(tokenizer: Tokenizer, sample: Sample) -> Encoded:
    """Token ids of `sample.text` and their labels. With spans, a tokenizer that reports character
    offsets (`encode_offsets`: a fast HF tokenizer) tokenizes the whole text once, so the ids equal
    `tokenizer.encode(text)`; any other tokenizer encodes the pieces between span edges one by one
    (exact for the byte tokenizer, where bytes concatenate)."""
    if sample.spans is None:
        ids = torch.tensor(tokenizer.encode(sample.text), dtype=torch.long)
        return Encoded(ids, ids)
    encode_offsets = getattr(tokenizer, "encode_offsets", None)
    offsets = encode_offsets(sample.text) if encode_offsets is not None else None
    if offsets is None:
        return _encode_pieces(tokenizer, sample.text, sample.spans)
    ids, bounds = offsets
    trained = torch.zeros(len(ids), dtype=torch.bool)
    token_start, token_end = torch.tensor(bounds, dtype=torch.long).reshape(-1, 2).unbind(1)
    for start, end in sample.spans:
        trained |= (token_start < end) & (token_end > start)  # overlaps [start, end)
    ids_t = torch.tensor(ids, dtype=torch.long)
    return Encoded(ids_t, torch.where(trained, ids_t, IGNORE_INDEX))


def _encode_pieces(tokenizer: Tokenizer, text: str, spans: Sequence[Span]) -> Encoded:
    ids: list[int] = []
    labels: list[int] = []
    cursor = 0
    for start, end in spans:
        for piece, trained in ((text[cursor:start], False), (text[start:end], True)):
            if piece:
                piece_ids = tokenizer.encode(piece)
                ids += piece_ids
                labels += piece_ids if trained else [IGNORE_INDEX] * len(piece_ids)
        cursor = end
    tail = tokenizer.encode(text[cursor:]) if cursor < len(text) else []
    ids += tail
    labels += [IGNORE_INDEX] * len(tail)
    return Encoded(torch.tensor(ids, dtype=torch.long), torch.tensor(labels, dtype=torch.long))
