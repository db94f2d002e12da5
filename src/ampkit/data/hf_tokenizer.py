"""A local Hugging Face tokenizer behind ampkit's `Tokenizer` protocol.

`--model hf:PATH` tokenizes with the directory's own tokenizer when it has one
(`AutoTokenizer.from_pretrained(PATH, local_files_only=True)`), else with raw bytes (vocabulary 256,
which the model's vocabulary must cover). Nothing is downloaded.

Text is encoded without special tokens (no BOS/EOS added per paragraph): ampkit's data pipeline
decides where units start and end. ampkit cuts long paragraphs into `seq_len + 1`-token windows
itself, so the tokenizer's `model_max_length` is lifted (otherwise transformers warns about every
paragraph longer than the model's context, which ampkit never feeds whole).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ampkit.data.tokenizer import ByteTokenizer, Tokenizer
from ampkit.errors import UsageError
from ampkit.models.hf import hf_model_dir, is_hf_model, load_transformers

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
"""Any of these in the model directory means it ships a tokenizer (transformers' file names)."""
_NO_LENGTH_LIMIT = int(1e30)  # transformers' own "no limit" value (VERY_LARGE_INTEGER)


def has_tokenizer(path: str | Path) -> bool:
    return any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


class HFTokenizer:
    """A transformers tokenizer with the `Tokenizer` shape. `vocab_size` counts added tokens too
    (`len(tokenizer)`): every id `encode` returns is below it."""

    def __init__(self, tokenizer: Any, *, name: str, path: Path | None = None) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.path = path
        """the folder it was loaded from (its saved chat template is read there: `ampkit.data.chat`)"""
        self.vocab_size = len(tokenizer)
        tokenizer.model_max_length = _NO_LENGTH_LIMIT  # ampkit windows long text itself (module docstring)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]] | None:
        """(ids, each token's [start, end) in characters): the ids of `encode(text)`. None for a slow
        (Python) tokenizer, which has no offsets (`ampkit.data.samples` then encodes piece by piece)."""
        if not getattr(self.tokenizer, "is_fast", False):
            return None
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoding["input_ids"]), [(int(a), int(b)) for a, b in encoding["offset_mapping"]]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, vocab_size={self.vocab_size})"


def load_hf_tokenizer(path: str | Path) -> HFTokenizer:
    """The tokenizer saved in `path` (offline); an unreadable one is a UsageError."""
    transformers = load_transformers()
    path = Path(path)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, KeyError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UsageError(
            f"transformers cannot load the tokenizer in {path} ({first}); fix or remove its "
            "tokenizer files (without them ampkit tokenizes raw bytes)"
        ) from None
    return HFTokenizer(tokenizer, name=f"hf:{path.resolve().name}", path=path)


def tokenizer_for_model(spec: str) -> Tokenizer:
    """The tokenizer a model spec implies: an `hf:PATH` directory's own when it has one, else bytes."""
    if is_hf_model(spec):
        path = hf_model_dir(spec)
        if has_tokenizer(path):
            return load_hf_tokenizer(path)
    return ByteTokenizer()
