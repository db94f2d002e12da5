"""Tokenizers: raw UTF-8 bytes by default; anything with the `Tokenizer` shape can slot in
(e.g. a local Hugging Face tokenizer wrapped by a later adapter)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer."""

    name: str
    """Short label recorded in run configs and reports."""
    vocab_size: int
    """Number of distinct token ids; every id from `encode` is in [0, vocab_size)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """Token id = one UTF-8 byte (vocabulary 256): no files, no training, no unknown tokens.

    A non-ASCII character becomes 2-4 tokens, so counts are "bytes", not "words".
    """

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        # errors="replace": a model's sampled ids may cut a multi-byte character in half.
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"
