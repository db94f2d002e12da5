"""Corpora: the embedded default (CPython's documentation topics) and the user's own local text.

A `Corpus` is a name and a tuple of documents. For sampling, documents are split into
*paragraphs* (on blank lines): their very uneven lengths are what make padding waste real.
Nothing here downloads anything; a user's data comes from a local path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from ampkit.data.instructions import InstructionSet, detect_format, parse_examples, read_jsonl_records
from ampkit.data.samples import Sample, check_train_on
from ampkit.data.shards import ShardSet, is_shard_dir
from ampkit.data.tables import Table, is_table, open_table
from ampkit.errors import UsageError

DEFAULT_CORPUS_NAME = "pydoc-topics"
TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIX = ".jsonl"
_SUPPORTED = (
    'a .txt/.md file, a .jsonl file (chat "messages", "prompt"/"completion" or "text" per line), '
    "a .parquet/.arrow table or a folder of them, a saved Hugging Face dataset's folder, or a directory of .txt/.md "
    "files"
)

# One or more blank lines (possibly holding spaces) separate paragraphs. The pattern keeps the
# indentation of the next paragraph's first line, so code blocks stay intact.
_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """A named collection of text documents, in a fixed (deterministic) order."""

    name: str
    """Short label shown in reports, e.g. "pydoc-topics" or the file/directory name."""
    documents: tuple[str, ...]
    """The documents' text; none is empty or whitespace-only."""

    def __post_init__(self) -> None:
        if not self.documents:
            raise UsageError(f"corpus {self.name!r} has no documents; give a path holding some text")
        if any(not isinstance(d, str) or not d.strip() for d in self.documents):
            raise ValueError("Corpus.documents must be non-empty strings (drop blank ones first)")

    format = "text"
    """What `ampkit.data.load_data` found (instruction data: `InstructionSet.format`)."""

    @property
    def num_chars(self) -> int:
        """Total length of all documents, in characters (not bytes)."""
        return sum(len(d) for d in self.documents)

    def samples(self, template: object = None, *, train_on: str = "all") -> list[Sample]:
        """Every paragraph, trained everywhere (a text corpus has no answers to single out)."""
        if check_train_on(train_on) == "completion":
            raise UsageError(
                f"--train-on completion needs instruction data (chat or prompt/completion .jsonl), but "
                f"{self.name!r} is text; drop --train-on or pass --train-on all"
            )
        return [Sample(text=p) for p in paragraphs(self)]


def load_default_corpus() -> Corpus:
    """The CPython documentation topics that ship with every Python (`pydoc_data.topics`).

    On Python 3.11: 79 topics, ~465 K characters, ~2,600 paragraphs. Sorted by topic name so the
    order never depends on dict insertion order across Python builds.
    """
    from pydoc_data.topics import topics  # stdlib; imported here so importing ampkit stays cheap

    documents = tuple(_normalize(topics[key]) for key in sorted(topics))
    return Corpus(name=DEFAULT_CORPUS_NAME, documents=tuple(d for d in documents if d.strip()))


def load_data(path: str | os.PathLike[str] | None, *, text_field: str = "text") -> Corpus | InstructionSet | ShardSet:
    """What `--data` names, by content: a directory with a shard index is token shards
    (`ampkit.data.shards`, opened, not read); a .jsonl of chat or prompt/completion records, or a
    table (a file, a folder of them, a saved dataset: `ampkit.data.tables`) with `messages` or
    `prompt`/`completion` columns, is instruction data (`ampkit.data.instructions`); anything else is
    a text corpus (`load_corpus`)."""
    if path is not None and str(path) != "default" and is_shard_dir(path):
        return ShardSet(path)
    if path is not None and str(path) != "default" and is_table(path):
        return load_table(open_table(path), text_field=text_field)
    if path is not None and str(path) != "default" and Path(path).suffix.lower() == JSONL_SUFFIX:
        p = _existing(Path(path))
        records = read_jsonl_records(p, _read_text(p))
        kind = detect_format(p, records, text_field=text_field)
        if kind != "text":
            return parse_examples(p, records, kind=kind)
    return load_corpus(path, text_field=text_field)


def load_corpus(path: str | os.PathLike[str] | None, *, text_field: str = "text") -> Corpus:
    """Load a text corpus from `path`; None or "default" gives the embedded default.

    - a `.txt` / `.md` file: one document;
    - a directory: every `.txt` / `.md` file under it (recursive, sorted by relative path, hidden
      files and directories skipped), one document each;
    - a `.jsonl` file: one document per line, from its `text_field` field (blank lines skipped).
    Whitespace-only documents are dropped. Every problem raises a one-line `UsageError`.
    """
    if path is None or str(path) == "default":
        return load_default_corpus()
    p = _existing(Path(path))
    if is_table(p):
        data = load_table(open_table(p), text_field=text_field)
        if not isinstance(data, Corpus):
            raise UsageError(f"{str(p)!r} is {data.format} data, not text; pass a table with a text column")
        return data
    if p.is_dir():
        documents = _load_directory(p)
    elif p.suffix.lower() in TEXT_SUFFIXES:
        documents = [_read_text(p)]
    elif p.suffix.lower() == JSONL_SUFFIX:
        documents = _load_jsonl(p, text_field)
    else:
        kind = p.suffix or "(no suffix)"
        raise UsageError(f"corpus file {str(p)!r} has an unsupported type {kind!r}; pass {_SUPPORTED}")
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise UsageError(
            f"corpus path {str(p)!r} holds no usable text (empty or whitespace only); pass a path with some text"
        )
    return Corpus(name=p.resolve().name or str(p), documents=tuple(documents))


def load_table(table: Table, *, text_field: str = "text") -> Corpus | InstructionSet:
    """A table's rows: instruction examples (a `messages` column, or `prompt` and `completion`), else a
    text corpus of the `text_field` column, one document a row (blank rows dropped, as a .jsonl's)."""
    kind = table.format(text_field=text_field)
    if kind != "text":
        columns = ["messages"] if kind == "chat" else ["prompt", "completion"]
        return parse_examples(table.where, table.rows(columns), kind=kind, unit="row", name=table.name)
    documents = tuple(text for _, text in table.texts(text_field) if text.strip())
    if not documents:
        raise UsageError(
            f"{str(table.where)!r} holds no text in column {text_field!r} (no rows, or only blank ones); pass a "
            "table with some rows"
        )
    return Corpus(name=table.name, documents=documents)


def _existing(p: Path) -> Path:
    if not p.exists():
        raise UsageError(
            f"corpus path {str(p)!r} does not exist; pass {_SUPPORTED}, or omit it for the built-in corpus"
        )
    return p


def _load_directory(root: Path) -> list[str]:
    files = sorted(
        (f for f in root.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES),
        key=lambda f: f.relative_to(root).as_posix(),
    )
    files = [f for f in files if not any(part.startswith(".") for part in f.relative_to(root).parts)]
    if not files:
        raise UsageError(
            f"corpus directory {str(root)!r} has no .txt or .md files; put text files in it or pass a file"
        )
    return [_read_text(f) for f in files]


def _load_jsonl(path: Path, text_field: str) -> list[str]:
    documents = []
    for line_no, record in read_jsonl_records(path, _read_text(path)):
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise UsageError(
                f'{str(path)!r} line {line_no} has no string "{text_field}" field; make every line one JSON '
                f'object like {{"{text_field}": "..."}} (or chat "messages", or "prompt"/"completion")'
            )
        documents.append(text)
    return documents


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:  # permissions, a broken link, a file removed while listing
        raise UsageError(
            f"cannot read {str(path)!r} ({exc.strerror or exc}); check the path and its permissions"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{str(path)!r} is not UTF-8 text (undecodable byte at offset {exc.start}), perhaps a binary file; "
            "pass UTF-8 text files only"
        ) from None
    if "\x00" in text:  # valid UTF-8 but NUL bytes: a binary file in disguise
        raise UsageError(f"{str(path)!r} contains NUL bytes and looks like a binary file; pass UTF-8 text files only")
    return _normalize(text)


def _normalize(text: str) -> str:
    """Unix line endings, so paragraph splitting and byte counts do not depend on the platform."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_documents(document: str) -> list[str]:
    """Split one document into paragraphs on blank lines; drop whitespace-only pieces.

    Trailing whitespace of each paragraph is removed; leading indentation is kept (code blocks).
    """
    pieces = (p.rstrip() for p in _PARAGRAPH_BREAK.split(document))
    return [p.lstrip("\n") for p in pieces if p.strip()]


def paragraphs(corpus: Corpus) -> list[str]:
    """All paragraphs of all documents, in corpus order (the sampling units before tokenization)."""
    return [p for doc in corpus.documents for p in split_documents(doc)]


def train_val_split(
    items: Sequence[T], *, val_fraction: float = 0.05, seed: int = 0, source: str = ""
) -> tuple[list[T], list[T]]:
    """Split `items` into (train, val) with a seeded permutation; both keep the original order.
    `source`: the file the items are a jsonl's records of (instruction data), named when too few.

    The val size is round(len * val_fraction) clamped to [1, len - 1], so both sides are non-empty.
    Uses its own `torch.Generator`: the global RNG is untouched.
    """
    if not 0.0 < val_fraction < 1.0:
        raise UsageError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}; use e.g. 0.05")
    n = len(items)
    if n < 2 and source:
        raise UsageError(
            f"{source!r} holds {n} example(s) (one a line); ampkit train holds some out for evaluation: give it "
            "at least 2"
        )
    if n < 2:
        raise UsageError(
            f"need at least 2 paragraphs to split into train and validation, got {n}; "
            "give a longer corpus with paragraphs separated by blank lines"
        )
    n_val = min(max(1, round(n * val_fraction)), n - 1)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    val_idx = set(order[:n_val])
    train = [x for i, x in enumerate(items) if i not in val_idx]
    val = [x for i, x in enumerate(items) if i in val_idx]
    return train, val
