"""`ampkit data prepare`: tokenize a source once into token shards (`ampkit.data.shards`).

The source is read as the in-memory pipeline reads it (`ampkit.data.corpus`: a .txt/.md file, a
directory of them, a .jsonl, a Parquet/Arrow table, a folder of them or a saved Hugging Face dataset
(`ampkit.data.tables`), "default" for the embedded corpus), streamed: a file at a time, a .jsonl a
line at a time, a table a record batch at a time. Its format is found as `--data` finds it: text
gives one document a paragraph; chat or prompt/completion data gives one document an example,
rendered with the chat template (`ampkit.data.chat`) and written with its loss mask (a byte a token,
1 where `--train-on completion` trains: `encode_sample`'s labels), so the shards train with the
masks of the in-memory examples. Items are tokenized in chunks, in order, by a pool of worker
processes when it pays (fork; one per core; enough text and a tokenizer slower than the pipe: a BPE,
not raw bytes), and appended to the open shard; a shard closes at the first document boundary at or
past `shard_tokens`.

Nothing half-written is left: a shard is written to `NAME.tmp`, fsync'ed and renamed; after each
shard `prepare.state.json` (atomic) records the shards done and how many paragraphs they hold; the
index is written last, and then the state file is removed. A rerun on the same OUT after an
interrupt (even SIGKILL) removes `*.tmp`, keeps the finished shards, skips the paragraphs they hold
(split again, not tokenized again) and continues: the shards come out byte for byte as an
uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ampkit.data.batching import IGNORE_INDEX
from ampkit.data.chat import ChatTemplate, chat_template_for
from ampkit.data.corpus import JSONL_SUFFIX, TEXT_SUFFIXES, _read_text, load_default_corpus, split_documents
from ampkit.data.instructions import Example, parse_record, record_format
from ampkit.data.samples import encode_sample
from ampkit.data.shards import (
    INDEX_FILE,
    MASK_DTYPE,
    PROBE_TEXT,
    SCHEMA,
    TOKEN_DTYPES,
    template_identity,
    token_dtype_for,
    tokenizer_identity,
)
from ampkit.data.tables import Table, is_table, open_table
from ampkit.data.tokenizer import Tokenizer
from ampkit.errors import UsageError
from ampkit.records import Record
from ampkit.runs import atomic_write, fsync_dir, make_dir, remove_quietly, write_json_atomic

STATE_FILE = "prepare.state.json"
DEFAULT_SHARD_TOKENS = 1 << 28  # 256 Mi tokens: 512 MiB a uint16 shard
CHUNK_PARAGRAPHS = 512  # paragraphs a worker tokenizes per task
POOL_MIN_CHARS = 4 << 20  # below ~4 MiB of text one process is faster than starting a pool
POOL_MIN_SLOWNESS = 5e6  # characters/s: a tokenizer faster than this is not worth a pool (bytes: ~1e8)


@dataclass(kw_only=True)
class PrepareSummary(Record):
    """What `ampkit data prepare` did (`--json` prints it)."""

    schema: str = "ampkit.data-prepare/1"
    out: str
    source: str
    tokenizer: dict[str, Any]
    dtype: str
    content: str
    """text, chat or prompt-completion (the last two with a loss mask beside each shard)"""
    shards: int
    documents: int
    tokens: int
    resumed_shards: int
    """shards a previous, interrupted run had finished (kept, not tokenized again)"""
    trained_tokens: int
    """tokens with a loss under --train-on completion (the mask's ones; all tokens for text)"""
    workers: int
    seconds: float
    tokens_per_s: float
    """tokens written by this run per second of wall time (the resumed shards not counted)"""
    files: list[str] = field(default_factory=list)


# -- the source, a paragraph at a time ----------------------------------------------------------
def source_files(src: str) -> list[Path]:
    """The files `src` names, in the order they are read ("default": none, the embedded corpus)."""
    if src == "default":
        return []
    p = Path(src)
    if not p.exists():
        raise UsageError(
            f"prepare: source {src!r} does not exist; pass a .txt/.md file, a .jsonl, a .parquet/.arrow table (or a "
            "folder of them), a saved dataset or a directory"
        )
    if is_table(p):
        return list(open_table(p).files)
    if p.is_dir():
        files = sorted(
            (f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES),
            key=lambda f: f.relative_to(p).as_posix(),
        )
        files = [f for f in files if not any(part.startswith(".") for part in f.relative_to(p).parts)]
        if not files:
            raise UsageError(f"prepare: directory {src!r} has no .txt or .md files; put text files in it")
        return files
    if p.suffix.lower() not in (*TEXT_SUFFIXES, JSONL_SUFFIX):
        raise UsageError(
            f"prepare: {src!r} is not a .txt/.md/.jsonl/.parquet/.arrow file or a directory; pass one of those"
        )
    return [p]


def source_format(src: str, *, text_field: str = "text") -> str:
    """text, chat or prompt-completion, as `--data` finds it: a table's columns, a .jsonl's first record."""
    if src == "default":
        return "text"
    if is_table(src):
        return open_table(src).format(text_field=text_field)
    path = Path(src)
    if path.suffix.lower() == JSONL_SUFFIX and path.is_file():
        for _, record in _jsonl_records(path, kind=None, text_field=text_field):
            return record_format(record, text_field=text_field) or "text"  # a bad first line: said by line
    return "text"


def iter_items(src: str, *, kind: str, text_field: str = "text") -> Iterator[str | Example]:
    """The documents to tokenize, in order: text's paragraphs, or instruction data's examples (each
    checked as `--data` checks it: one line naming the file and the line or row)."""
    if kind == "text":
        yield from iter_paragraphs(src, text_field=text_field)
        return
    if is_table(src):
        table = open_table(src)
        columns = ["messages"] if kind == "chat" else ["prompt", "completion"]
        for row, record in table.rows(columns):
            yield parse_record(record, kind=kind, where=f"{table.where} row {row}")
        return
    path = Path(src)
    for line_no, record in _jsonl_records(path, kind=kind, text_field=text_field):
        yield parse_record(record, kind=kind, where=f"{path} line {line_no}")


def iter_paragraphs(src: str, *, text_field: str = "text") -> Iterator[str]:
    """Every paragraph of `src`, in corpus order (`ampkit.data.paragraphs` on `load_corpus(src)`)."""
    if src == "default":
        for doc in load_default_corpus().documents:
            yield from split_documents(doc)
        return
    if is_table(src):
        yield from _table_paragraphs(open_table(src), text_field)
        return
    for f in source_files(src):
        if f.suffix.lower() == JSONL_SUFFIX:
            yield from _jsonl_paragraphs(f, text_field)
        else:
            yield from split_documents(_read_text(f))


def _jsonl_paragraphs(path: Path, text_field: str) -> Iterator[str]:
    for line_no, record in _jsonl_records(path, kind="text", text_field=text_field):
        text = record.get(text_field)
        if not isinstance(text, str):
            raise UsageError(
                f'{path} line {line_no} has no string "{text_field}" field; make every line one JSON object'
            )
        yield from split_documents(text.replace("\r\n", "\n").replace("\r", "\n"))


def _jsonl_records(path: Path, *, kind: str | None, text_field: str) -> Iterator[tuple[int, Any]]:
    """(line number, record) of every non-blank line, a line at a time; `kind`: every record must be
    of that format (None: any), as `ampkit.data.instructions.detect_format` checks a file in memory."""
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UsageError(
                    f"{path} line {line_no}: not JSON ({err.msg}); make every line one JSON object"
                ) from None
            found = record_format(record, text_field=text_field)
            if kind is not None and found != kind and not (kind == "text" and found is None):
                raise UsageError(
                    f"{path} line {line_no} is {'a ' + found + ' record' if found else 'of no known format'} but "
                    f"the file's first record is {kind}; keep one format per file"
                )
            yield line_no, record


def _table_paragraphs(table: Table, text_field: str) -> Iterator[str]:
    """A table's text column, a record batch at a time (the table is never read whole)."""
    for _, text in table.texts(text_field):
        yield from split_documents(text)


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# -- tokenizing, in a pool when it pays -----------------------------------------------------------
@dataclass(frozen=True)
class _Encoding:
    """How items become ids: the tokenizer, the shards' dtype, and the template examples render with
    (None: the items are text paragraphs, trained everywhere, no mask)."""

    tokenizer: Tokenizer
    dtype: np.dtype[Any]
    template: ChatTemplate | None = None


_WORKER: _Encoding | None = None  # set in the parent before the fork; each worker inherits it

Encoded = tuple[np.ndarray, np.ndarray, np.ndarray | None]
"""A chunk's ids back to back (the shards' dtype), each item's token count, and (instruction data)
its loss mask back to back (uint8, 1 = the token carries a loss): buffers, which cross the pool's pipe
as bytes (a list of Python ints pickles ~5x slower than tokenizing bytes)."""


def _encode_with(how: _Encoding, items: Sequence[Any]) -> Encoded:
    if how.template is None:
        ids = [how.tokenizer.encode(p) for p in items]
        flat = np.fromiter((i for piece in ids for i in piece), dtype=how.dtype, count=sum(len(x) for x in ids))
        return flat, np.array([len(x) for x in ids], dtype=np.int64), None
    encoded = [encode_sample(how.tokenizer, item.render(how.template, completion_only=True)) for item in items]
    lengths = np.array([len(e.ids) for e in encoded], dtype=np.int64)
    if not encoded or not lengths.sum():
        return np.zeros(0, how.dtype), lengths, np.zeros(0, MASK_DTYPE)
    flat = np.concatenate([e.ids.numpy() for e in encoded]).astype(how.dtype)
    mask = np.concatenate([(e.labels != IGNORE_INDEX).numpy() for e in encoded]).astype(MASK_DTYPE)
    return flat, lengths, mask


def _encode_chunk(items: Sequence[Any]) -> Encoded:
    assert _WORKER is not None
    return _encode_with(_WORKER, items)


@contextlib.contextmanager
def _encoder(how: _Encoding, workers: int) -> Iterator[Callable[[Iterator[list[Any]]], Iterator[Encoded]]]:
    """chunks of items -> their ids (and masks), in order; `workers` > 1: a forked pool (the tokenizer
    and template are inherited, not pickled), else this process."""
    global _WORKER
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield lambda chunks: (_encode_with(how, chunk) for chunk in chunks)
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # HF's own threads would fight the pool
    _WORKER = how
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield lambda chunks: pool.imap(_encode_chunk, chunks)


def default_workers(src: str, tokenizer: Tokenizer) -> int:
    """One per usable core when the pool pays: enough text (`POOL_MIN_CHARS`) and a tokenizer slower
    than `POOL_MIN_SLOWNESS` characters/s on the probe text (raw bytes tokenize faster than the
    parent can take the ids from a pipe), else 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    size = sum(f.stat().st_size for f in source_files(src)) if src != "default" else 0
    if cores == 1 or size < POOL_MIN_CHARS:
        return 1
    probe = PROBE_TEXT * 256  # ~20 K characters
    started = time.perf_counter()
    tokenizer.encode(probe)
    chars_per_s = len(probe) / max(time.perf_counter() - started, 1e-9)
    return cores if chars_per_s < POOL_MIN_SLOWNESS else 1


# -- writing ---------------------------------------------------------------------------------------
class ShardWriter:
    """Appends documents to the open shard and closes it, atomically, past `shard_tokens`; keeps the
    state file a rerun resumes from. Usable on its own (the benchmark writes synthetic ids with it).
    `content` chat or prompt-completion: every document comes with its loss mask (`add`), written as
    `shard-NNNNN.mask.bin` beside the ids, and `template` (`template_identity`) goes in the index."""

    def __init__(
        self,
        out: Path,
        *,
        identity: dict[str, Any],
        shard_tokens: int,
        source: dict[str, Any],
        content: str = "text",
        template: dict[str, str] | None = None,
    ):
        self.out, self.identity, self.shard_tokens, self.source = out, identity, shard_tokens, source
        self.content, self.template = content, template
        self.masked = content != "text"
        self.dtype_name = token_dtype_for(identity["vocab_size"])
        self.dtype = TOKEN_DTYPES[self.dtype_name]
        self.done: list[dict[str, Any]] = []
        self.paragraphs_done = 0  # paragraphs (instruction data: examples) held by the finished shards
        self._parts: list[np.ndarray] = []
        self._masks: list[np.ndarray] = []
        self._ends: list[int] = []
        self._size = 0
        self._open_paragraphs = 0

    def resume(self) -> None:
        """Take up an interrupted run's state in `out` (its finished shards checked by size)."""
        for tmp in self.out.glob("*.tmp"):
            remove_quietly(tmp)
        state_file = self.out / STATE_FILE
        if not state_file.is_file():
            return
        state = json.loads(state_file.read_text(encoding="utf-8"))
        mine = {k: v for k, v in self._state().items() if k != "shards"}
        theirs = {k: state.get(k, "text" if k == "content" else None) for k in mine}
        if theirs != mine:
            changed = ", ".join(k for k in mine if mine[k] != theirs[k])
            raise UsageError(
                f"{self.out} holds an interrupted prepare of another {changed}; rerun it with the same "
                "source, --tokenizer, --chat-template and --shard-tokens, or pass another OUT"
            )
        for entry in state["shards"]:
            sizes = [(entry["file"], self.dtype.itemsize)] + ([(entry["mask"], 1)] if self.masked else [])
            if not all(_has_size(self.out / f, entry["tokens"] * width) for f, width in sizes):
                break
            self.done.append(entry)
        self.paragraphs_done = sum(int(e["paragraphs"]) for e in self.done)

    def add(self, ids: Sequence[int] | np.ndarray, mask: Sequence[int] | np.ndarray | None = None) -> None:
        """One document (a paragraph's ids; an example's, with its mask: 1 where a token carries a loss)."""
        arr = np.asarray(ids, dtype=self.dtype)
        if self.masked:
            if mask is None or len(mask) != len(arr):
                raise ValueError("a masked shard set needs one mask byte per token of every document")
            self._masks.append(np.asarray(mask, dtype=MASK_DTYPE))
        self._parts.append(arr)
        self._size += len(arr)
        self._ends.append(self._size)
        self._open_paragraphs += 1
        if self._size >= self.shard_tokens:
            self.close_shard()

    def add_chunk(self, flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Documents back to back (`lengths[i]` tokens each; a masked set: their masks back to back too)."""
        cuts = np.cumsum(lengths)[:-1]
        pieces = np.split(flat, cuts) if len(lengths) else []
        masks = np.split(mask, cuts) if mask is not None and len(lengths) else [None] * len(pieces)
        for piece, piece_mask in zip(pieces, masks, strict=True):
            self.add(piece, piece_mask)

    def close_shard(self) -> None:
        if not self._ends:
            return
        name = f"shard-{len(self.done):05d}"
        data = np.concatenate(self._parts) if self._parts else np.zeros(0, self.dtype)
        digest = hashlib.sha256(data.tobytes()).hexdigest()
        with atomic_write(self.out / f"{name}.bin") as fh:
            data.tofile(fh)
        with atomic_write(self.out / f"{name}.docs.npy") as fh:
            np.save(fh, np.asarray(self._ends, dtype=np.uint64))
        entry = {
            "file": f"{name}.bin",
            "docs": f"{name}.docs.npy",
            "tokens": len(data),
            "documents": len(self._ends),
            "paragraphs": self._open_paragraphs,
            "max_id": int(data.max()) if len(data) else 0,
            "sha256": digest,
        }
        if self.masked:
            mask = np.concatenate(self._masks) if self._masks else np.zeros(0, MASK_DTYPE)
            with atomic_write(self.out / f"{name}.mask.bin") as fh:
                mask.tofile(fh)
            entry.update(mask=f"{name}.mask.bin", trained=int(mask.sum(dtype=np.int64)))
        self.done.append(entry)
        self.paragraphs_done += self._open_paragraphs
        self._parts, self._masks, self._ends, self._size, self._open_paragraphs = [], [], [], 0, 0
        write_json_atomic(self.out / STATE_FILE, self._state())
        fsync_dir(self.out)

    def _state(self) -> dict[str, Any]:
        return {
            "tokenizer": self.identity,
            "source": self.source,
            "shard_tokens": self.shard_tokens,
            "content": self.content,
            "chat_template": self.template,
            "shards": self.done,
        }

    def finish(self) -> dict[str, Any]:
        """Close the open shard, write the index (last), drop the state file; the index."""
        self.close_shard()
        if not self.done:
            raise UsageError(f"prepare: {self.source.get('path')} holds no text; nothing was written")
        index = {
            "schema": SCHEMA,
            "dtype": self.dtype_name,
            "tokenizer": self.identity,
            "source": self.source,
            "content": self.content,
            **({"mask": "completion", "chat_template": self.template} if self.masked else {}),
            "tokens": sum(e["tokens"] for e in self.done),
            "documents": sum(e["documents"] for e in self.done),
            "shards": self.done,
        }
        write_json_atomic(self.out / INDEX_FILE, index)
        remove_quietly(self.out / STATE_FILE)
        fsync_dir(self.out)
        return index


def _has_size(path: Path, size: int) -> bool:
    return path.is_file() and path.stat().st_size == size


def open_out(out: str | Path) -> Path:
    """OUT, new or empty or holding an interrupted prepare; a finished shard set or other files are refused."""
    p = Path(out)
    if (p / INDEX_FILE).exists():
        raise UsageError(f"{p} already holds a prepared shard set; pass another OUT or remove it")
    if p.is_dir() and not (p / STATE_FILE).exists() and any(p.iterdir()):
        raise UsageError(f"{p} is not empty and holds no interrupted prepare; pass a new or empty OUT")
    return make_dir(p)


def source_identity(src: str) -> dict[str, Any]:
    """What a resumed prepare must find unchanged: the source's path, its files and their sizes."""
    files = source_files(src)
    return {
        "path": src if src == "default" else str(Path(src).resolve()),
        "bytes": sum(f.stat().st_size for f in files),
    }


def prepare(
    src: str,
    out: str | Path,
    *,
    tokenizer: Tokenizer,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    workers: int | None = None,
    text_field: str = "text",
    chat_template: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PrepareSummary:
    """Tokenize `src` into shards in `out` (module docstring); `chat_template`: `--chat-template`'s
    file for chat data (else the tokenizer's own, else the built-in one); `progress(items, tokens)`
    after each chunk. Resumes an interrupted prepare in `out`."""
    if shard_tokens < 1:
        raise UsageError(f"--shard-tokens must be >= 1, got {shard_tokens}")
    began = time.perf_counter()
    identity, source = tokenizer_identity(tokenizer), source_identity(src)  # a missing source said first
    kind = source_format(src, text_field=text_field)
    template = chat_template_for(tokenizer, chat_template) if kind != "text" else None
    out_dir = open_out(out)
    writer = ShardWriter(
        out_dir,
        identity=identity,
        shard_tokens=shard_tokens,
        source=source,
        content=kind,
        template=template_identity(template) if template is not None else None,
    )
    writer.resume()
    resumed, skip = len(writer.done), writer.paragraphs_done
    workers = default_workers(src, tokenizer) if workers is None else max(1, workers)
    items = itertools.islice(iter_items(src, kind=kind, text_field=text_field), skip, None)  # past finished shards
    seen, written = skip, 0
    with _encoder(_Encoding(tokenizer, writer.dtype, template), workers) as encode:
        for flat, lengths, mask in encode(_chunks(items, CHUNK_PARAGRAPHS)):
            writer.add_chunk(flat, lengths, mask)
            written += len(flat)
            seen += len(lengths)
            if progress is not None:
                progress(seen, written)
    index = writer.finish()
    seconds = time.perf_counter() - began
    return PrepareSummary(
        out=str(out_dir),
        source=writer.source["path"],
        tokenizer=identity,
        dtype=index["dtype"],
        content=kind,
        shards=len(index["shards"]),
        documents=index["documents"],
        tokens=index["tokens"],
        resumed_shards=resumed,
        trained_tokens=sum(int(e.get("trained", e["tokens"])) for e in index["shards"]),
        workers=workers,
        seconds=round(seconds, 3),
        tokens_per_s=round(written / seconds, 1) if seconds > 0 else 0.0,
        files=[INDEX_FILE, *(e[k] for e in index["shards"] for k in ("file", "docs", "mask") if k in e)],
    )
