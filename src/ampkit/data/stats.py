"""`ampkit data stats PATH --seq-len N`: what a data set costs before training on it.

Figures, all from the run's own pipeline (the samples, units and `BatchSampler` training would use):
- the length histogram of the documents (paragraphs, examples, or a shard set's documents), in tokens,
  in power-of-two bins;
- the padding waste of four ways to fill `batch_size` rows at `seq_len`: pad-to-max (every row
  seq_len slots: 1 - targets / (units * seq_len)), pad-to-longest (`--batching pad`: each batch padded
  to its longest unit), bucket and pack, the last three over one epoch of the sampler's own batches
  (`BatchSampler.skip_batch`: their token account, no tokens read); waste = 1 - processed / slots;
- the trained-token share (targets with a loss / targets, under `--train-on`);
- the duplicate share (documents, and tokens, an exact dedup would remove);
- the token count (document tokens; targets: what the units train on).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ampkit.data.chat import chat_template_for
from ampkit.data.corpus import load_data
from ampkit.data.dedup import check_dedup_mode, dedup_indices
from ampkit.data.instructions import InstructionSet
from ampkit.data.sampler import BatchSampler
from ampkit.data.samples import encode_sample
from ampkit.data.shards import ShardSet, ShardWindows
from ampkit.data.tokenizer import Tokenizer
from ampkit.errors import UsageError
from ampkit.records import Record

WASTE_WAYS = ("pad-to-max", "pad-to-longest", "bucket", "pack")
"""The padding-waste columns, in the order reports list them."""
_STRATEGY_OF = {"pad-to-longest": "pad", "bucket": "bucket", "pack": "pack"}  # the sampler's strategies
WAY_OF_BATCHING = {strategy: way for way, strategy in _STRATEGY_OF.items()}
"""`--batching` -> its padding-waste figure (`bench --sweep` reads its rows' padding from here)."""


@dataclass(kw_only=True)
class DataStats(Record):
    """`ampkit data stats`'s record (`--json` prints it)."""

    schema: str = "ampkit.data-stats/1"
    command: str = "data-stats"
    provenance: dict[str, Any] | None = None
    """`ampkit.provenance` (the CLI's: created, versions, command line, settings); None from the API"""
    path: str
    format: str
    """text, chat, prompt-completion or shards"""
    tokenizer: str
    seq_len: int
    batch_size: int
    train_on: str = "auto"
    text_field: str = "text"
    dedup: str = "none"
    """"exact": the figures after an exact dedup (what `--dedup exact` trains on); the duplicate shares
    are always what it would remove"""
    documents: int
    tokens: int
    """tokens in all documents"""
    targets: int
    """target slots of the units at seq_len (masked ones included)"""
    trained_share: float
    """targets with a loss / targets"""
    duplicate_documents_share: float
    duplicate_tokens_share: float
    length_histogram: list[dict[str, int]]
    """power-of-two bins of document length in tokens: {"min", "max" (exclusive), "count"}"""
    length_p50: int
    length_p90: int
    length_max: int
    padding_waste: dict[str, float]
    """share of computed slots that are padding, per way (`WASTE_WAYS`)"""


@dataclass
class _Source:
    lengths: np.ndarray  # tokens a document
    units: Any  # what BatchSampler takes: token lists, or ShardWindows
    labels: list[Any] | None
    truncate: bool
    duplicates: tuple[float, float]  # (documents, tokens) shares


def data_stats(
    path: str,
    *,
    tokenizer: Tokenizer,
    seq_len: int,
    batch_size: int,
    train_on: str = "auto",
    seed: int = 0,
    text_field: str = "text",
    chat_template: str | None = None,
    dedup: str = "none",
) -> DataStats:
    """The figures (module docstring) of what `path` holds, as `--data PATH` would train on it at
    `seq_len` x `batch_size` (`chat_template`: `--chat-template`'s file; `dedup`: `--dedup`'s mode)."""
    check_dedup_mode(dedup)
    data = load_data(path, text_field=text_field)
    if isinstance(data, ShardSet):
        source = _shard_source(data, tokenizer, seq_len, train_on, chat_template=chat_template, dedup=dedup)
    else:
        source = _memory_source(data, tokenizer, train_on, chat_template=chat_template, dedup=dedup)
    samplers = {
        way: BatchSampler(
            source.units,
            labels=source.labels,
            truncate=source.truncate,
            batch_size=batch_size,
            seq_len=seq_len,
            seed=seed,
            strategy=strategy,
        )
        for way, strategy in _STRATEGY_OF.items()
    }
    first = samplers["pad-to-longest"]
    waste = {"pad-to-max": 1.0 - first.num_tokens / (len(first.units) * seq_len)}
    waste.update({way: _epoch_waste(sampler) for way, sampler in samplers.items()})
    lengths = source.lengths
    return DataStats(
        path=str(path),
        format=data.format,
        tokenizer=tokenizer.name,
        seq_len=seq_len,
        batch_size=batch_size,
        train_on=train_on,
        text_field=text_field,
        dedup=dedup,
        documents=len(lengths),
        tokens=int(lengths.sum()),
        targets=first.num_tokens,
        trained_share=first.num_trained / first.num_tokens,
        duplicate_documents_share=source.duplicates[0],
        duplicate_tokens_share=source.duplicates[1],
        length_histogram=length_histogram(lengths),
        length_p50=int(np.percentile(lengths, 50)),
        length_p90=int(np.percentile(lengths, 90)),
        length_max=int(lengths.max()),
        padding_waste={way: round(waste[way], 6) for way in WASTE_WAYS},
    )


def _epoch_waste(sampler: BatchSampler) -> float:
    """1 - processed / slots over the first epoch's batches (pad's last one may take a few units of
    the next epoch; pack's last few waiting units stay unplaced)."""
    processed = slots = 0
    while sampler.epoch == 0 and sampler.cursor < len(sampler.units):
        _, p, s = sampler.skip_batch()
        processed, slots = processed + p, slots + s
    return 1.0 - processed / slots if slots else 0.0


def _memory_source(data: Any, tokenizer: Tokenizer, train_on: str, *, chat_template: str | None, dedup: str) -> _Source:
    template = chat_template_for(tokenizer, chat_template) if isinstance(data, InstructionSet) else None
    samples = data.samples(template, train_on=train_on)
    encoded = [encode_sample(tokenizer, s) for s in samples]
    sizes = [len(e.ids) for e in encoded]
    kept, removed = dedup_indices([s.text for s in samples], mode="exact", sizes=sizes)
    if dedup == "exact":  # the figures of what --dedup exact trains on
        encoded, sizes = [encoded[i] for i in kept], [sizes[i] for i in kept]
    return _Source(
        lengths=np.array(sizes, dtype=np.int64),
        units=[e.ids for e in encoded],
        labels=[e.labels for e in encoded],
        truncate=data.format != "text",
        duplicates=(removed.items_removed / max(removed.items_before, 1), removed.tokens_removed_fraction),
    )


def _shard_source(
    shards: ShardSet, tokenizer: Tokenizer, seq_len: int, train_on: str, *, chat_template: str | None, dedup: str
) -> _Source:
    """Every document of the set (instruction shards: masked per `train_on`, as `--data` reads them);
    duplicates by the SHA-256 of their ids (the set is read once). Refused: dedup (it needs the text)
    and a `chat_template` other than the one instruction shards were rendered with."""
    if dedup != "none":
        raise UsageError(f"--dedup {dedup} needs the text, and {shards.path} holds token shards")
    if chat_template is not None:
        shards.check_template(chat_template_for(tokenizer, chat_template))
    lengths = shards.doc_end - shards.doc_start
    seen: set[bytes] = set()
    removed_docs = removed_tokens = 0
    for doc in range(shards.num_documents):
        key = hashlib.sha256(shards.document_tokens(doc).tobytes()).digest()
        if key in seen:
            removed_docs, removed_tokens = removed_docs + 1, removed_tokens + int(lengths[doc])
        seen.add(key)
    docs = np.arange(shards.num_documents, dtype=np.int64)
    vocab = int(shards.tokenizer["vocab_size"])
    windows = ShardWindows(shards, docs, seq_len=seq_len, vocab_size=vocab, train_on=train_on)
    total = int(lengths.sum())
    return _Source(
        lengths=lengths,
        units=windows,
        labels=None,
        truncate=False,
        duplicates=(removed_docs / max(len(lengths), 1), removed_tokens / total if total else 0.0),
    )


def length_histogram(lengths: Sequence[int] | np.ndarray) -> list[dict[str, int]]:
    """Counts in bins [1, 2), [2, 4), [4, 8), ... up to the longest (a 0-token document counts in the first)."""
    arr = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    top = int(np.ceil(np.log2(int(arr.max()) + 1)))
    edges = [1 << k for k in range(top + 1)]
    counts, _ = np.histogram(arr, bins=edges)
    return [{"min": lo, "max": hi, "count": int(c)} for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True)]
