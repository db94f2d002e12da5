"""A deterministic, seeded, resumable, infinite stream of batches over tokenized units.

Order of operations: samples (a text corpus's paragraphs, or instruction examples rendered with their
loss spans) -> tokens and labels (once) -> [dedup] -> train/val split -> units (`make_units`) ->
epoch order -> units taken by strategy -> collate -> `Batch`. Each unit's labels travel with it
(`ampkit.data.batching`), so every strategy keeps the loss masks.

Determinism: epoch e starts from `torch.randperm(N, generator=Generator().manual_seed(seed + e))`,
with its own generator, so the global torch RNG is never read or advanced. The position in the
stream is just (epoch, cursor), counted in units: `state_dict()` / `load_state_dict()` restore it.

How each strategy takes units from the epoch order:
- pad: the next `batch_size` units (a batch may straddle two epochs).
- bucket: the epoch order is built of buckets: units sorted by length (ties in random order),
  cut into groups of `batch_size`, the groups shuffled. One batch is one group, so a batch never
  straddles epochs and one group per epoch may be smaller than `batch_size`.
- pack: units in the same order as pad, placed best-fit into `batch_size` rows of `seq_len`
  slots. A unit that fits in no row is *deferred*: it waits (with at most `batch_size` others) and
  goes first into the next batch, where it always fits (each deferred unit fits an empty row).
  The batch closes when `batch_size` units wait or every row is full. So every unit is used once
  per epoch, none is split or dropped by packing, and the deferred units are sampler state.
  On the embedded corpus at seq_len 512, batch 8: 2.7% of slots are padding (closing the batch at
  the first misfit instead would waste 9.8%).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ampkit.data.batching import (
    BATCHING_STRATEGIES,
    IGNORE_INDEX,
    Batch,
    best_fit_row,
    collate_pack,
    collate_pad,
)
from ampkit.data.chat import ChatTemplate
from ampkit.data.corpus import Corpus, train_val_split
from ampkit.data.dedup import DedupStats, dedup_indices
from ampkit.data.instructions import InstructionSet
from ampkit.data.samples import Encoded, encode_sample
from ampkit.data.shards import ShardSet, ShardWindows, split_documents
from ampkit.data.tokenizer import Tokenizer
from ampkit.errors import UsageError

MIN_UNIT_TOKENS = 2  # one (input, target) pair; shorter units carry no training signal


TokenList = Sequence[int] | torch.Tensor


def make_units(token_lists: Sequence[TokenList], *, seq_len: int) -> list[torch.Tensor]:
    """Turn token lists into units of 2 .. seq_len + 1 tokens; no target is ever lost.

    A list longer than seq_len + 1 is cut into consecutive windows of seq_len + 1 tokens that
    *overlap by one token* (stride seq_len), so every (token, next token) pair of the original
    appears as a target exactly once: sum of (len(unit) - 1) == sum of (len(list) - 1).
    Lists with fewer than 2 tokens are dropped (they have no target).
    """
    return make_labeled_units(token_lists, None, seq_len=seq_len)[0]


def make_labeled_units(
    token_lists: Sequence[TokenList],
    label_lists: Sequence[TokenList | None] | None,
    *,
    seq_len: int,
    truncate: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`make_units` with each list's labels cut the same way: (units, their labels).

    `label_lists[i]` None (or no `label_lists`): every token carries a loss, and the unit is its own
    labels (the same tensor, no copy). `truncate`: keep only the first window of a long list (an
    instruction example: a window without its prompt teaches little) instead of windowing it all.
    A unit none of whose targets carries a loss is dropped: it would cost compute and train nothing.
    """
    _check_positive("seq_len", seq_len)
    units: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    for i, tokens in enumerate(token_lists):
        t = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        lab = None if label_lists is None else label_lists[i]
        lab_t = t if lab is None or lab is tokens else torch.as_tensor(lab, dtype=torch.long).reshape(-1)
        if len(t) < MIN_UNIT_TOKENS:
            continue
        starts = range(0, 1) if truncate else range(0, len(t) - 1, seq_len)  # the last window has >= 2 tokens
        for start in starts:
            unit = t[start : start + seq_len + 1].clone()
            if lab_t is t:
                units.append(unit)
                labels.append(unit)
                continue
            unit_labels = lab_t[start : start + seq_len + 1].clone()
            if bool((unit_labels[1:] != IGNORE_INDEX).any()):
                units.append(unit)
                labels.append(unit_labels)
    return units, labels


class BatchSampler:
    """Infinite stream of `Batch`es of (at most) `batch_size` rows; epochs wrap seamlessly.

    With `strategy="pad"` a batch may straddle two epochs (the tail of one permutation and the head
    of the next), so every batch has exactly `batch_size` rows; "bucket" and "pack" are described in
    the module docstring. `shuffle=False` visits units in the given order (bucket: in length order).
    """

    def __init__(
        self,
        units: Sequence[Sequence[int]] | Sequence[torch.Tensor] | ShardWindows,
        *,
        batch_size: int,
        seq_len: int,
        seed: int,
        strategy: str = "pad",
        pad_id: int = 0,
        shuffle: bool = True,
        labels: Sequence[TokenList | None] | None = None,
        truncate: bool = False,
    ) -> None:
        """`units`: token lists, cut into units here (`make_labeled_units`, with `labels` and
        `truncate`: one label list per token list, None where every token carries a loss), or a
        `ShardWindows`, units already cut and read from the shards' memory map one at a time, with
        its own labels (its units where every token carries a loss; instruction shards' masks)."""
        _check_positive("batch_size", batch_size)
        _check_positive("seq_len", seq_len)
        if strategy not in BATCHING_STRATEGIES:
            known = ", ".join(BATCHING_STRATEGIES)
            raise UsageError(f"unknown batching strategy {strategy!r}; choose one of: {known}")
        self.units: Sequence[torch.Tensor] | ShardWindows
        self.labels: Sequence[torch.Tensor] | ShardWindows | Any
        if isinstance(units, ShardWindows):
            self.units, self.labels = units, units.labels  # unmasked: the same object, each window read once
            self.num_tokens, self.num_trained = units.num_tokens, units.num_trained
            self._length = units.length
        else:
            self.units, self.labels = make_labeled_units(units, labels, seq_len=seq_len, truncate=truncate)
            self.num_tokens = sum(len(u) - 1 for u in self.units)  # real target slots per epoch, masked or not
            self.num_trained = sum(int((lab[1:] != IGNORE_INDEX).sum()) for lab in self.labels)  # with a loss
            self._length = lambda i: len(self.units[i])
        if not len(self.units):
            raise UsageError(
                "no training text: every unit has fewer than 2 tokens or no token with a loss; give more text "
                "(instruction data: answers within --seq-len)"
            )
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.strategy = strategy
        self.pad_id = pad_id
        self.shuffle = shuffle
        self.epoch = 0
        self.cursor = 0  # index into this epoch's order of the next unit to take
        self._order: np.ndarray | None = None  # cached unit order for self.epoch (int64, 8 bytes a unit)
        self._group_ends = np.zeros(0, dtype=np.int64)  # bucket only: sorted cursor values where a batch ends
        self._pending: list[int] = []  # pack only: deferred unit indices, first into the next batch

    def __len__(self) -> int:
        """Batches per epoch, rounded up (the stream itself is infinite).

        pack: a lower bound, real tokens / (batch_size * seq_len); how many batches an epoch really
        takes depends on how well the units fit (a few % more on the embedded corpus).
        """
        if self.strategy == "pack":
            return max(1, -(-self.num_tokens // (self.batch_size * self.seq_len)))
        return -(-len(self.units) // self.batch_size)

    def _epoch_order(self) -> np.ndarray:
        if self._order is None:
            n = len(self.units)
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=gen).numpy() if self.shuffle else np.arange(n, dtype=np.int64)
            if self.strategy == "bucket":
                order = self._bucket_order(order, gen)
            self._order = order
        return self._order

    def _unit_lengths(self) -> np.ndarray:
        if isinstance(self.units, ShardWindows):
            return self.units.lengths()  # from its document table: no reads
        return np.array([len(u) for u in self.units], dtype=np.int64)

    def _bucket_order(self, order: np.ndarray, gen: torch.Generator) -> np.ndarray:
        """Sort by length (a stable sort: ties keep the random order), cut into groups, shuffle groups."""
        order = order[np.argsort(self._unit_lengths()[order], kind="stable")]
        starts = np.arange(0, len(order), self.batch_size)
        if self.shuffle:
            starts = starts[torch.randperm(len(starts), generator=gen).numpy()]
        groups = [order[g : g + self.batch_size] for g in starts]
        self._group_ends = np.cumsum([len(g) for g in groups])
        return np.concatenate(groups)

    def _wrap_epoch(self) -> None:
        if self.cursor >= len(self.units):
            self.epoch += 1
            self.cursor = 0
            self._order = None

    def _next_index(self) -> int:
        self._wrap_epoch()
        index = int(self._epoch_order()[self.cursor])
        self.cursor += 1
        return index

    def next_batch(self) -> Batch:
        """The next batch by the strategy (see the module docstring); advances the stream."""
        rows = self._take_rows()
        if self.strategy == "pack":
            units = [[self.units[i] for i in r] for r in rows]
            labels = [self._labels_of(r, u) for r, u in zip(rows, units, strict=True)]
            return collate_pack(units, seq_len=self.seq_len, pad_id=self.pad_id, labels=labels)
        chosen = [r[0] for r in rows]
        flat = [self.units[i] for i in chosen]
        return collate_pad(flat, pad_id=self.pad_id, labels=self._labels_of(chosen, flat))

    def skip_batch(self) -> tuple[int, int, int]:
        """Advance past the next batch without reading its tokens: its token account (trained,
        processed, slots: what `ampkit.core.step.lm_count` of `next_batch()` would be), from the units' lengths
        and, for masked units, their labels (in memory). A rank skips the batches other ranks train
        on (`ampkit.distributed.sampler`), so with shards each rank reads only its own windows."""
        rows = self._take_rows()
        sizes = [[self._length(i) - 1 for i in r] for r in rows]
        processed = sum(sum(r) for r in sizes)
        width = self.seq_len if self.strategy == "pack" else max(n for r in sizes for n in r)
        return sum(self._trained(i) for r in rows for i in r), processed, len(rows) * width

    def _trained(self, index: int) -> int:
        """Targets with a loss in unit `index` (all of them when it is its own labels)."""
        if isinstance(self.units, ShardWindows):
            return self.units.trained(index)  # from its document table: no reads
        if self.labels is self.units or self.labels[index] is self.units[index]:
            return self._length(index) - 1
        return int((self.labels[index][1:] != IGNORE_INDEX).sum())

    def _take_rows(self) -> list[list[int]]:
        """The next batch's unit indices, a list per row (pad and bucket: one unit a row); advances."""
        if self.strategy == "pack":
            return self._take_packed_rows()
        if self.strategy == "bucket":
            self._wrap_epoch()
            self._epoch_order()  # (re)builds this epoch's order and its group boundaries
            end = int(self._group_ends[np.searchsorted(self._group_ends, self.cursor, side="right")])
            return [[self._next_index()] for _ in range(end - self.cursor)]
        return [[self._next_index()] for _ in range(self.batch_size)]

    def _labels_of(self, chosen: list[int], units: list[torch.Tensor]) -> list[torch.Tensor]:
        """The chosen units' labels; units that are their own labels are not read twice."""
        return units if self.labels is self.units else [self.labels[i] for i in chosen]

    def _take_packed_rows(self) -> list[list[int]]:
        """Best-fit units into `batch_size` rows, deferring misfits (see the module docstring).

        Never empty: the first deferred unit (or, with none, the first new unit) meets empty rows,
        and a unit has at most seq_len slots. Terminates: every placed unit fills >= 1 slot.
        """
        rows: list[list[int]] = [[] for _ in range(self.batch_size)]  # unit indices per row
        free = [self.seq_len] * self.batch_size

        def place(index: int) -> bool:
            need = self._length(index) - 1
            row = best_fit_row(free, need)
            if row is not None:
                rows[row].append(index)
                free[row] -= need
            return row is not None

        # Deferred units first, in order; one that still fits nowhere (only after a smaller
        # batch_size on resume) keeps waiting.
        waiting = [i for i in self._pending if not place(i)]
        while len(waiting) < self.batch_size and max(free) > 0:
            index = self._next_index()
            if not place(index):
                waiting.append(index)
        self._pending = waiting
        return [r for r in rows if r]  # rows left empty (tiny corpora) are not sent to the model

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Plain ints/strs/bools (JSON- and `torch.load(weights_only=True)`-safe)."""
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "strategy": self.strategy,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "num_units": len(self.units),
            "num_tokens": self.num_tokens,
            "num_trained": self.num_trained,
            "pending": list(self._pending),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the saved sampler stopped.

        The data and its order must be the same (seed, shuffle, seq_len, unit and token counts);
        otherwise resuming would silently replay or skip data, so that is refused. `batch_size`
        and `strategy` may change between pad and pack (same unit order; the position is counted
        in units, not batches); bucket's order depends on both, so with bucket they must match.
        """
        for key in ("seed", "shuffle", "seq_len", "num_units", "num_tokens", "num_trained"):
            mine = len(self.units) if key == "num_units" else getattr(self, key)
            if key == "num_trained" and key not in state:  # written before loss masks: all trained
                continue
            if state.get(key) != mine:
                raise UsageError(
                    f"cannot resume the data stream: saved {key}={state.get(key)!r} but this run has {mine!r}; "
                    "resume with the same corpus, tokenizer, seq_len, seed and --train-on"
                )
        if "bucket" in (state.get("strategy"), self.strategy):
            for key in ("strategy", "batch_size"):
                if state.get(key) != getattr(self, key):
                    raise UsageError(
                        f"cannot resume the data stream: saved {key}={state.get(key)!r} but this run has "
                        f"{getattr(self, key)!r}; bucketed batches depend on both, so resume with the same ones"
                    )
        pending = [int(i) for i in state.get("pending", [])]
        if pending and self.strategy != "pack":
            raise UsageError(
                f"cannot resume the data stream: {len(pending)} packed units are still waiting for a "
                f"batch and --batching {self.strategy} would skip them; resume with --batching pack"
            )
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor <= len(self.units) or not all(0 <= i < len(self.units) for i in pending):
            raise ValueError(f"corrupt sampler state: epoch={epoch}, cursor={cursor}, pending={pending}")
        self.epoch, self.cursor, self._order, self._pending = epoch, cursor, None, pending


@dataclass(kw_only=True)
class TrainData:
    """What training reads: the train stream, the fixed held-out batches, and what dedup removed."""

    train: BatchSampler
    """Infinite, seeded, resumable stream of training batches."""
    val_batches: list[Batch]
    """Held-out batches, built once, always padded (see `build_data`)."""
    dedup: DedupStats
    """Paragraphs and tokens removed before the split (mode "none": nothing removed)."""


def build_data(
    corpus: Corpus | InstructionSet | ShardSet,
    tokenizer: Tokenizer,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    val_fraction: float = 0.05,
    max_val_batches: int = 16,
    strategy: str = "pad",
    dedup: str = "none",
    template: ChatTemplate | None = None,
    train_on: str = "auto",
) -> TrainData:
    """Samples -> tokens and labels -> dedup -> seeded train/val split -> train sampler and held-out batches.

    The samples are a text corpus's paragraphs or instruction examples rendered with `template` (their
    loss spans per `train_on`); each is tokenized once. Dedup runs before the split so a duplicate can
    never sit on both sides (a held-out paragraph also seen in training would flatter the held-out
    loss). The validation batches cover the val samples once, in corpus order, `batch_size` units each
    (the last one may be smaller), capped at `max_val_batches`. They are always padded, whatever
    `strategy`: the held-out set and its per-token loss are then identical across strategies (packing
    a fixed count of batches would cover more paragraphs and change what "held-out loss" measures).
    Instruction examples are truncated to seq_len + 1 tokens, not windowed (`make_labeled_units`)."""
    _check_positive("max_val_batches", max_val_batches)
    if isinstance(corpus, ShardSet):
        return build_shard_data(
            corpus,
            tokenizer,
            seq_len=seq_len,
            batch_size=batch_size,
            seed=seed,
            val_fraction=val_fraction,
            max_val_batches=max_val_batches,
            strategy=strategy,
            dedup=dedup,
            train_on=train_on,
            template=template,
        )
    encoded, kept, stats = _encoded_and_deduped(corpus, tokenizer, template=template, train_on=train_on, dedup=dedup)
    truncate = corpus.format != "text"  # instruction examples: cut at seq_len + 1, named when too few
    source = corpus.name if truncate else ""
    train_idx, val_idx = train_val_split(kept, val_fraction=val_fraction, seed=seed, source=source)
    if truncate:
        _require_a_trained_target(corpus.name, [encoded[i].labels for i in train_idx], seq_len=seq_len)
    train = BatchSampler(
        [encoded[i].ids for i in train_idx],
        labels=[encoded[i].labels for i in train_idx],
        batch_size=batch_size,
        seq_len=seq_len,
        seed=seed,
        strategy=strategy,
        pad_id=0,
        truncate=truncate,
    )
    val_units, val_labels = make_labeled_units(
        [encoded[i].ids for i in val_idx], [encoded[i].labels for i in val_idx], seq_len=seq_len, truncate=truncate
    )
    val_batches = held_out_batches(val_units, val_labels, batch_size=batch_size, max_batches=max_val_batches)
    return TrainData(train=train, val_batches=val_batches, dedup=stats)


def _encoded_and_deduped(
    corpus: Corpus | InstructionSet, tokenizer: Tokenizer, *, template: ChatTemplate | None, train_on: str, dedup: str
) -> tuple[list[Encoded], list[int], DedupStats]:
    """Each sample tokenized once, and the indices `dedup` keeps (per paragraph, or per example for
    instruction data) with what it removed."""
    samples = corpus.samples(template, train_on=train_on)
    encoded = [encode_sample(tokenizer, sample) for sample in samples]
    level = "paragraph" if corpus.format == "text" else "example"
    kept, stats = dedup_indices([s.text for s in samples], mode=dedup, sizes=[len(e.ids) for e in encoded], level=level)
    return encoded, kept, stats


def _require_a_trained_target(name: str, labels: list[torch.Tensor], *, seq_len: int) -> None:
    """Refuse instruction data none of whose training examples has a target with a loss in the first
    seq_len + 1 tokens it is cut to (all answers truncated away)."""
    if not any(bool((row[1 : seq_len + 1] != IGNORE_INDEX).any()) for row in labels):
        raise UsageError(
            f"{name}: no training example has a token with a loss within its first --seq-len {seq_len} "
            "tokens (examples are cut there); raise --seq-len or shorten the prompts"
        )


def held_out_batches(
    units: Sequence[torch.Tensor], labels: Sequence[torch.Tensor] | None, *, batch_size: int, max_batches: int
) -> list[Batch]:
    """The held-out units once, in order, `batch_size` a batch (the last may be smaller), at most
    `max_batches`, always padded (`labels`: each unit's, or None where the targets are the inputs')."""
    end = min(len(units), batch_size * max_batches)
    return [
        collate_pad(units[s : s + batch_size], pad_id=0, labels=None if labels is None else labels[s : s + batch_size])
        for s in range(0, end, batch_size)
    ]


def build_shard_data(
    shards: ShardSet,
    tokenizer: Tokenizer,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    val_fraction: float = 0.05,
    max_val_batches: int = 16,
    strategy: str = "pad",
    dedup: str = "none",
    train_on: str = "auto",
    template: ChatTemplate | None = None,
) -> TrainData:
    """`build_data` on token shards: the documents split as paragraphs (or examples) are
    (`split_documents`, the same seeded choice), the train stream's units read from the memory map
    (`ShardWindows`, instruction shards' masks applied under `train_on` completion/auto), the held-out
    batches collated once. A tokenizer (or a given `template`) other than the shards' is refused; so
    are dedup (it needs the text: deduplicate before preparing) and --train-on completion on text."""
    shards.check_tokenizer(tokenizer)
    shards.check_template(template)
    if dedup != "none":
        raise UsageError(
            f"--dedup {dedup} needs the text, and {shards.path} holds token shards; "
            "deduplicate the source before preparing it"
        )
    train_docs, val_docs = split_documents(shards.num_documents, val_fraction=val_fraction, seed=seed)

    def cut(docs: np.ndarray) -> ShardWindows:
        return ShardWindows(shards, docs, seq_len=seq_len, vocab_size=tokenizer.vocab_size, train_on=train_on)

    windows = cut(train_docs)
    if shards.content != "text" and not windows.num_trained:
        _require_a_trained_target(shards.name, [], seq_len=seq_len)  # as in memory: all answers cut away
    train = BatchSampler(windows, batch_size=batch_size, seq_len=seq_len, seed=seed, strategy=strategy, pad_id=0)
    val = cut(val_docs)
    held = range(min(len(val), batch_size * max_val_batches))
    val_units = [val[i] for i in held]
    val_labels = None if val.labels is val else [val.labels[i] for i in held]
    val_batches = held_out_batches(val_units, val_labels, batch_size=batch_size, max_batches=max_val_batches)
    nothing_removed = DedupStats(
        mode="none",
        level="document",
        items_before=shards.num_documents,
        items_removed=0,
        tokens_before=shards.num_tokens,
        tokens_removed=0,
    )
    return TrainData(train=train, val_batches=val_batches, dedup=nothing_removed)


def build_samplers(corpus: Corpus, tokenizer: Tokenizer, **options: Any) -> tuple[BatchSampler, list[Batch]]:
    """Train sampler and a fixed list of held-out batches, split by paragraph (seeded), no dedup.

    `build_data` with `dedup="none"` (`options`: its seq_len, batch_size, seed, val_fraction,
    max_val_batches and strategy), for callers that need only the two streams.
    """
    data = build_data(corpus, tokenizer, dedup="none", **options)
    return data.train, data.val_batches


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {value!r}; pass a whole number >= 1")
