"""Token shards: a corpus tokenized once (`ampkit data prepare`, `ampkit.data.prepare`), read through
memory maps so training holds windows, never the corpus.

A prepared directory holds:
- `shard-NNNNN.bin`: token ids, one shard's documents back to back, raw little-endian uint16 when
  the tokenizer's vocabulary fits in 16 bits, else uint32 (2 or 4 bytes a token);
- `shard-NNNNN.docs.npy`: the shard's document ends (uint64 token offsets; a document never spans
  two shards), its boundaries kept beside the data so the index stays small at any document count;
- `index.json` (written last: a directory without it is not a shard set): the tokenizer's identity
  (name, vocabulary, a fingerprint of the ids it gives a fixed probe text), the token dtype, and per
  shard its files, token and document counts, largest id and SHA-256.

Documents are what the in-memory pipeline calls paragraphs, and the units are cut the same way
(`make_labeled_units`: windows of seq_len + 1 tokens overlapping by one), so a shard set trains on
exactly the units the in-memory corpus would: same split, same order, same batches (a test checks).
Memory: 16 bytes per document (its shard and start) plus 8 per training document (the windows'
cumulative count); the tokens stay in the page cache. Hazard: a window is copied out of the map to
an int64 tensor (4x the bytes of a uint16 window), once per batch row.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ampkit.data.tokenizer import Tokenizer
from ampkit.errors import UsageError

INDEX_FILE = "index.json"
SCHEMA = "ampkit.shards/1"
TOKEN_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
PROBE_TEXT = "The quick brown fox: 12 x 3.5 = 42.0; naïve café — 日本語, emoji 🙂\n\tdef f(x): return x"
"""Text whose ids fingerprint a tokenizer (letters, digits, punctuation, accents, CJK, an emoji,
whitespace): two tokenizers that split it alike are treated as one."""


def token_dtype_for(vocab_size: int) -> str:
    """uint16 when every id (< vocab_size) fits in 16 bits, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def tokenizer_identity(tokenizer: Tokenizer) -> dict[str, Any]:
    """What a shard set records of the tokenizer that made it: name, vocabulary and a fingerprint."""
    ids = json.dumps(list(tokenizer.encode(PROBE_TEXT))).encode()
    return {
        "name": tokenizer.name,
        "vocab_size": int(tokenizer.vocab_size),
        "fingerprint": hashlib.sha256(ids).hexdigest()[:16],
    }


def is_shard_dir(path: str | os.PathLike[str]) -> bool:
    """A prepared shard set: a directory with an index."""
    p = Path(path)
    return p.is_dir() and (p / INDEX_FILE).is_file()


@dataclass(frozen=True)
class _Shard:
    file: Path
    tokens: np.memmap
    ends: np.ndarray  # document ends, token offsets into `tokens`


class ShardSet:
    """A prepared directory, opened and checked against its index: every shard's size, its document
    table and the recorded largest id (`check_tokenizer` checks the tokenizer and the vocabulary)."""

    format = "shards"
    """What `--data` found (`ampkit.data.load_data`'s word for it)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.index = _read_index(self.path)
        self.name = self.path.resolve().name
        self.dtype = TOKEN_DTYPES[self.index["dtype"]]
        self.tokenizer: dict[str, Any] = self.index["tokenizer"]
        self.shards = [self._open(entry) for entry in self.index["shards"]]
        counts = [len(s.ends) for s in self.shards]
        shard_of = np.repeat(np.arange(len(self.shards), dtype=np.int32), counts)
        starts = [np.concatenate(([0], s.ends[:-1])).astype(np.int64) for s in self.shards]
        ends = [s.ends.astype(np.int64) for s in self.shards]
        self.doc_shard = shard_of
        self.doc_start = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        self.doc_end = np.concatenate(ends) if ends else np.zeros(0, np.int64)
        self.num_documents = len(self.doc_start)
        self.num_tokens = int(self.doc_end.sum() - self.doc_start.sum())

    def _open(self, entry: dict[str, Any]) -> _Shard:
        file = self.path / entry["file"]
        docs = self.path / entry["docs"]
        for f in (file, docs):
            if not f.is_file():
                raise UsageError(f"{self.path}: the index names {f.name}, which is missing; prepare it again")
        expected = int(entry["tokens"]) * self.dtype.itemsize
        if file.stat().st_size != expected:
            raise UsageError(
                f"{file}: {file.stat().st_size} bytes but the index says {entry['tokens']} tokens "
                f"({expected} bytes); the index does not match its data, prepare it again"
            )
        ends = np.load(docs, mmap_mode="r")
        if (
            len(ends) != int(entry["documents"])
            or (len(ends) and int(ends[-1]) != int(entry["tokens"]))
            or bool((np.diff(ends.astype(np.int64), prepend=0) < 0).any())
        ):
            raise UsageError(
                f"{docs}: its document ends do not match the index ({entry['documents']} documents, "
                f"{entry['tokens']} tokens); the index does not match its data, prepare it again"
            )
        tokens = np.memmap(file, dtype=self.dtype, mode="r") if expected else np.zeros(0, self.dtype)
        return _Shard(file=file, tokens=tokens, ends=ends)  # type: ignore[arg-type]

    def check_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Refuse a run whose tokenizer is not the one the shards were made with, or whose
        vocabulary an id in them is at or past."""
        mine = tokenizer_identity(tokenizer)
        theirs = self.tokenizer
        if mine != theirs:
            raise UsageError(
                f"{self.path} was prepared with tokenizer {theirs['name']} (vocabulary {theirs['vocab_size']}, "
                f"fingerprint {theirs['fingerprint']}) but this run tokenizes with {mine['name']} (vocabulary "
                f"{mine['vocab_size']}, fingerprint {mine['fingerprint']}); prepare it again with --tokenizer "
                "set to this run's --model"
            )
        for entry in self.index["shards"]:
            if int(entry["max_id"]) >= tokenizer.vocab_size:
                raise UsageError(
                    f"{self.path / entry['file']}: token id {entry['max_id']} is at or past the vocabulary "
                    f"({tokenizer.vocab_size}); prepare it again with this run's tokenizer"
                )

    def document_tokens(self, doc: int) -> np.ndarray:
        """Document `doc`'s ids, a view into the map (no copy)."""
        shard = self.shards[int(self.doc_shard[doc])]
        return shard.tokens[int(self.doc_start[doc]) : int(self.doc_end[doc])]

    def samples(self, template: object = None, *, train_on: str = "all") -> list[Any]:
        raise UsageError(f"{self.path} holds token shards, not text; this use needs the text it was prepared from")


class ShardWindows:
    """The units of some documents of a `ShardSet`, read from the map on demand: a sequence of
    1-D LongTensors, cut as `make_labeled_units` cuts token lists (stride seq_len, one token of
    overlap, the last window of a document >= 2 tokens, documents of < 2 tokens give none).

    `units[i]` reads one window; `length(i)` and `lengths()` read nothing. Every id read is checked
    against `vocab_size` (one line naming the shard and the offset).
    """

    def __init__(self, shards: ShardSet, docs: np.ndarray, *, seq_len: int, vocab_size: int):
        self.shards, self.seq_len, self.vocab_size = shards, seq_len, vocab_size
        self.docs = np.asarray(docs, dtype=np.int64)
        sizes = shards.doc_end[self.docs] - shards.doc_start[self.docs]
        per_doc = np.where(sizes >= 2, -(-(sizes - 1) // seq_len), 0)  # ceil((L - 1) / S) windows
        self._cum = np.cumsum(per_doc)
        self._sizes = sizes
        self.num_tokens = int(np.clip(sizes - 1, 0, None).sum())  # targets: sum of (L - 1) over L >= 2

    def __len__(self) -> int:
        return int(self._cum[-1]) if len(self._cum) else 0

    def _locate(self, i: int) -> tuple[int, int, int]:
        """(document position in `docs`, window start within it, window length) of unit i."""
        if not 0 <= i < len(self):
            raise IndexError(f"unit {i} outside 0..{len(self) - 1}")
        d = int(np.searchsorted(self._cum, i, side="right"))
        w = i - (int(self._cum[d - 1]) if d else 0)
        start = w * self.seq_len
        return d, start, min(self.seq_len + 1, int(self._sizes[d]) - start)

    def length(self, i: int) -> int:
        return self._locate(int(i))[2]

    def lengths(self) -> np.ndarray:
        """Every unit's length, in unit order (bucketing sorts by them): int64, 8 bytes a unit."""
        out = np.full(len(self), self.seq_len + 1, dtype=np.int64)
        has = self._sizes >= 2
        last = self._cum[has] - 1  # the index of each document's last window
        first_of_last = (-(-(self._sizes[has] - 1) // self.seq_len) - 1) * self.seq_len
        out[last] = self._sizes[has] - first_of_last
        return out

    def __getitem__(self, i: int) -> torch.Tensor:
        d, start, n = self._locate(int(i))
        doc = int(self.docs[d])
        window = self.shards.document_tokens(doc)[start : start + n]
        top = int(window.max())
        if top >= self.vocab_size:
            shard = self.shards.shards[int(self.shards.doc_shard[doc])]
            at = int(self.shards.doc_start[doc]) + start + int(window.argmax())
            raise UsageError(
                f"{shard.file}: token id {top} at token {at} is at or past the vocabulary ({self.vocab_size}); "
                "the shard does not match its index or tokenizer, prepare it again"
            )
        return torch.from_numpy(window.astype(np.int64))


def split_documents(num_documents: int, *, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) document ids, each in document order: `ampkit.data.train_val_split`'s choice
    (the first round(n * val_fraction) of a seeded permutation, clamped to [1, n - 1]), on arrays."""
    if not 0.0 < val_fraction < 1.0:
        raise UsageError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}; use e.g. 0.05")
    n = num_documents
    if n < 2:
        raise UsageError(f"need at least 2 documents to split into train and validation, got {n}; prepare more text")
    n_val = min(max(1, round(n * val_fraction)), n - 1)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    is_val = np.zeros(n, dtype=bool)
    is_val[order[:n_val]] = True
    ids = np.arange(n, dtype=np.int64)
    return ids[~is_val], ids[is_val]


def _read_index(path: Path) -> dict[str, Any]:
    file = path / INDEX_FILE
    try:
        index = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"{file}: not a readable shard index ({err}); prepare it again") from None
    problem = _index_problem(index)
    if problem:
        raise UsageError(f"{file}: {problem}; prepare it again with `ampkit data prepare`")
    return index


def _index_problem(index: Any) -> str | None:
    if not isinstance(index, dict) or index.get("schema") != SCHEMA:
        return f"not a {SCHEMA} index"
    if index.get("dtype") not in TOKEN_DTYPES:
        return f"unknown token dtype {index.get('dtype')!r}"
    tok = index.get("tokenizer")
    if not isinstance(tok, dict) or not {"name", "vocab_size", "fingerprint"} <= set(tok):
        return "no tokenizer identity"
    shards = index.get("shards")
    keys = {"file", "docs", "tokens", "documents", "max_id"}
    if not isinstance(shards, list) or not all(isinstance(s, dict) and keys <= set(s) for s in shards):
        return "no shard list"
    return None
