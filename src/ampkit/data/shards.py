"""Token shards: a corpus tokenized once (`ampkit data prepare`, `ampkit.data.prepare`), read through
memory maps so training holds windows, never the corpus.

A prepared directory holds:
- `shard-NNNNN.bin`: token ids, one shard's documents back to back, raw little-endian uint16 when
  the tokenizer's vocabulary fits in 16 bits, else uint32 (2 or 4 bytes a token);
- `shard-NNNNN.docs.npy`: the shard's document ends (uint64 token offsets; a document never spans
  two shards), its boundaries kept beside the data so the index stays small at any document count;
- `shard-NNNNN.mask.bin` (instruction data only: `content` chat or prompt-completion): one uint8 a
  token, 1 where it carries a loss under `--train-on completion` (the assistant turns, the
  completion and its EOS), 0 elsewhere;
- `index.json` (written last: a directory without it is not a shard set): the tokenizer's identity
  (name, vocabulary, a fingerprint of the ids it gives a fixed probe text), the token dtype, the
  content (text, chat, prompt-completion; instruction data also the chat template's identity), and
  per shard its files, token and document counts, trained tokens, largest id and SHA-256.

Documents are what the in-memory pipeline calls paragraphs (instruction data: examples), and the
units are cut the same way (`make_labeled_units`: windows of seq_len + 1 tokens overlapping by one;
an example: its first seq_len + 1 tokens, dropped when none of its targets has a loss), so a shard
set trains on exactly the units the in-memory data would: same split, same order, same batches,
same labels (a test checks). `--train-on` is applied when read: completion (and auto) takes the
mask, all ignores it (the ids are the same).
Memory: 16 bytes per document (its shard and start) plus 8 per training document (the windows'
cumulative count; masked: 8 more, its trained targets); the tokens and masks stay in the page cache.
Hazard: a window is copied out of the map to an int64 tensor (4x the bytes of a uint16 window), once
per batch row (masked: twice, ids and labels).
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

from ampkit.data.batching import IGNORE_INDEX
from ampkit.data.tokenizer import Tokenizer
from ampkit.errors import UsageError

INDEX_FILE = "index.json"
SCHEMA = "ampkit.shards/1"
TOKEN_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MASK_DTYPE = np.dtype("u1")
"""A mask shard's byte a token: 1 = the token carries a loss (`--train-on completion`), 0 = not."""
CONTENTS = ("text", "chat", "prompt-completion")
_BLOCK = 1 << 22  # mask bytes gathered at once when counting trained targets (a 32 MiB index)
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


def template_identity(template: Any) -> dict[str, str]:
    """What instruction shards record of the chat template that rendered them: its name, a fingerprint
    of its source and the EOS text a prompt/completion pair ends with."""
    source = str(getattr(template, "source", ""))
    return {
        "name": str(template.name),
        "fingerprint": hashlib.sha256(source.encode()).hexdigest()[:16],
        "eos_text": str(template.eos_text),
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
    mask: np.ndarray | None = None  # instruction data: a byte a token, 1 = carries a loss


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
        self.content: str = self.index.get("content", "text")
        """text, chat or prompt-completion (the last two with a mask shard beside each token shard)"""
        self.chat_template: dict[str, str] | None = self.index.get("chat_template")
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
        return _Shard(file=file, tokens=tokens, ends=ends, mask=self._open_mask(entry))  # type: ignore[arg-type]

    def _open_mask(self, entry: dict[str, Any]) -> np.ndarray | None:
        """An instruction shard's mask, checked by size (a byte a token), memory-mapped."""
        if self.content == "text":
            return None
        mask = self.path / entry["mask"]
        if not mask.is_file():
            raise UsageError(
                f"{self.path}: the index names the loss mask {mask.name}, which is missing; prepare it again"
            )
        if mask.stat().st_size != int(entry["tokens"]):
            raise UsageError(
                f"{mask}: {mask.stat().st_size} bytes but the index says {entry['tokens']} tokens (a mask byte "
                "each); the mask does not match its data, prepare it again"
            )
        return np.memmap(mask, dtype=MASK_DTYPE, mode="r") if int(entry["tokens"]) else np.zeros(0, MASK_DTYPE)

    def masked(self, train_on: str) -> bool:
        """Whether `--train-on` reads the mask: instruction shards under completion and auto (all:
        every token trained); text shards never, and completion on them is refused."""
        if self.content != "text":
            return train_on != "all"
        if train_on == "completion":
            raise UsageError(
                f"--train-on completion needs instruction data, and {self.path} holds text shards; "
                "drop it or pass --train-on all"
            )
        return False

    def check_template(self, template: Any) -> None:
        """Refuse a run whose chat template (`template`, when it has one) is not the one the
        instruction shards were rendered with."""
        if self.content == "text" or template is None or self.chat_template is None:
            return
        mine, theirs = template_identity(template), self.chat_template
        if mine != theirs:
            raise UsageError(
                f"{self.path} was rendered with chat template {theirs['name']} (fingerprint {theirs['fingerprint']}, "
                f"EOS {theirs['eos_text']!r}) but this run renders with {mine['name']} (fingerprint "
                f"{mine['fingerprint']}, EOS {mine['eos_text']!r}); prepare it again with this run's --chat-template"
            )

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

    def document_mask(self, doc: int) -> np.ndarray:
        """Document `doc`'s mask bytes, a view into the mask map (instruction shards only)."""
        shard = self.shards[int(self.doc_shard[doc])]
        assert shard.mask is not None, "a text shard has no mask"
        return shard.mask[int(self.doc_start[doc]) : int(self.doc_end[doc])]

    def first_trained(self, docs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Targets with a loss among the first `sizes[i]` tokens of each document `docs[i]` (mask
        bytes 1 .. sizes[i] - 1: a target is the next token), int64, 0 where sizes[i] < 2. Reads
        those bytes of the mask map, a block at a time (memory bounded at any corpus size)."""
        out = np.zeros(len(docs), dtype=np.int64)
        has = np.flatnonzero(sizes >= 2)
        shard_of = self.doc_shard[docs[has]]
        for shard_no in np.unique(shard_of):
            sel = has[shard_of == shard_no]
            mask = self.shards[int(shard_no)].mask
            assert mask is not None, "a text shard has no mask"
            out[sel] = _span_sums(mask, self.doc_start[docs[sel]] + 1, sizes[sel] - 1)
        return out

    def samples(self, template: object = None, *, train_on: str = "all") -> list[Any]:
        raise UsageError(f"{self.path} holds token shards, not text; this use needs the text it was prepared from")


class ShardWindows:
    """The units of some documents of a `ShardSet`, read from the map on demand: a sequence of
    1-D LongTensors, cut as `make_labeled_units` cuts token lists (stride seq_len, one token of
    overlap, the last window of a document >= 2 tokens, documents of < 2 tokens give none; an
    instruction example: its first seq_len + 1 tokens only, and none when, masked, no target of
    those has a loss).

    `units[i]` reads one window; `length(i)`, `lengths()` and `trained(i)` read nothing. `labels`:
    the units themselves (the same object) where every token carries a loss, else a sequence whose
    `[i]` is unit i's labels (IGNORE_INDEX where the mask is 0). Every id read is checked against
    `vocab_size` (one line naming the shard and the offset).
    """

    def __init__(self, shards: ShardSet, docs: np.ndarray, *, seq_len: int, vocab_size: int, train_on: str = "all"):
        self.shards, self.seq_len, self.vocab_size = shards, seq_len, vocab_size
        self.docs = np.asarray(docs, dtype=np.int64)
        self.masked = shards.masked(train_on)
        sizes = shards.doc_end[self.docs] - shards.doc_start[self.docs]
        if shards.content != "text":  # an example is one unit, cut at seq_len + 1 (as in memory)
            sizes = np.minimum(sizes, seq_len + 1)
        self._trained = shards.first_trained(self.docs, sizes) if self.masked else None
        if self._trained is not None:
            sizes = np.where(self._trained > 0, sizes, 0)  # nothing to learn: no unit (as in memory)
        per_doc = np.where(sizes >= 2, -(-(sizes - 1) // seq_len), 0)  # ceil((L - 1) / S) windows
        self._cum = np.cumsum(per_doc)
        self._sizes = sizes
        self.num_tokens = int(np.clip(sizes - 1, 0, None).sum())  # targets: sum of (L - 1) over L >= 2
        self.num_trained = self.num_tokens if self._trained is None else int(self._trained.sum())
        self.labels: ShardWindows | _WindowLabels = _WindowLabels(self) if self.masked else self

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

    def trained(self, i: int) -> int:
        """Targets with a loss in unit i (masked: the document's count; a masked document is one unit)."""
        d, _, n = self._locate(int(i))
        return n - 1 if self._trained is None else int(self._trained[d])

    def mask(self, i: int) -> np.ndarray:
        """Unit i's mask bytes (a view into the map)."""
        d, start, n = self._locate(int(i))
        return self.shards.document_mask(int(self.docs[d]))[start : start + n]

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


class _WindowLabels:
    """The labels of masked `ShardWindows`: unit i's ids where its mask is 1, else IGNORE_INDEX."""

    def __init__(self, windows: ShardWindows):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> torch.Tensor:
        ids = self.windows[i]
        trained = torch.from_numpy(self.windows.mask(i).astype(np.bool_))
        return torch.where(trained, ids, IGNORE_INDEX)


def _span_sums(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """sum(data[s : s + n]) for each (s, n >= 1), gathering about `_BLOCK` elements at a time."""
    out = np.zeros(len(starts), dtype=np.int64)
    ends = np.cumsum(lengths)
    i = 0
    while i < len(starts):
        base = int(ends[i - 1]) if i else 0
        j = max(i + 1, int(np.searchsorted(ends, base + _BLOCK, side="right")))
        n = lengths[i:j]
        offsets = ends[i:j] - n - base  # where each span starts among the gathered elements
        positions = np.arange(int(n.sum()), dtype=np.int64) + np.repeat(starts[i:j] - offsets, n)
        out[i:j] = np.add.reduceat(np.asarray(data[positions]), offsets, dtype=np.int64)
        i = j
    return out


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
    content = index.get("content", "text")
    if content not in CONTENTS:
        return f"unknown content {content!r}"
    shards = index.get("shards")
    keys = {"file", "docs", "tokens", "documents", "max_id"} | ({"mask"} if content != "text" else set())
    if not isinstance(shards, list) or not all(isinstance(s, dict) and keys <= set(s) for s in shards):
        return (
            "no loss mask files in its shard list"
            if content != "text" and isinstance(shards, list)
            else "no shard list"
        )
    if content != "text" and not isinstance(index.get("chat_template"), dict):
        return "no chat template identity"
    return None
