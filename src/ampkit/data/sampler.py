"""A deterministic, seeded, resumable, infinite stream of batches over tokenized units.

Order of operations: paragraphs -> [dedup] -> train/val split -> tokens -> units (`make_units`) ->
epoch order -> units taken by strategy -> collate -> `Batch`.

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

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ampkit.data.batching import BATCHING_STRATEGIES, Batch, best_fit_row, collate_pack, collate_pad
from ampkit.data.corpus import Corpus, paragraphs, train_val_split
from ampkit.data.dedup import DedupStats, apply_dedup
from ampkit.data.tokenizer import Tokenizer
from ampkit.errors import UsageError

MIN_UNIT_TOKENS = 2  # one (input, target) pair; shorter units carry no training signal


def make_units(token_lists: Sequence[Sequence[int] | torch.Tensor], *, seq_len: int) -> list[torch.Tensor]:
    """Turn token lists into units of 2 .. seq_len + 1 tokens; no target is ever lost.

    A list longer than seq_len + 1 is cut into consecutive windows of seq_len + 1 tokens that
    *overlap by one token* (stride seq_len), so every (token, next token) pair of the original
    appears as a target exactly once: sum of (len(unit) - 1) == sum of (len(list) - 1).
    Lists with fewer than 2 tokens are dropped (they have no target).
    """
    _check_positive("seq_len", seq_len)
    units = []
    for tokens in token_lists:
        t = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        if len(t) < MIN_UNIT_TOKENS:
            continue
        for start in range(0, len(t) - 1, seq_len):  # the last window always has >= 2 tokens
            units.append(t[start : start + seq_len + 1].clone())
    return units


class BatchSampler:
    """Infinite stream of `Batch`es of (at most) `batch_size` rows; epochs wrap seamlessly.

    With `strategy="pad"` a batch may straddle two epochs (the tail of one permutation and the head
    of the next), so every batch has exactly `batch_size` rows; "bucket" and "pack" are described in
    the module docstring. `shuffle=False` visits units in the given order (bucket: in length order).
    """

    def __init__(
        self,
        units: Sequence[Sequence[int]] | Sequence[torch.Tensor],
        *,
        batch_size: int,
        seq_len: int,
        seed: int,
        strategy: str = "pad",
        pad_id: int = 0,
        shuffle: bool = True,
    ) -> None:
        _check_positive("batch_size", batch_size)
        _check_positive("seq_len", seq_len)
        if strategy not in BATCHING_STRATEGIES:
            known = ", ".join(BATCHING_STRATEGIES)
            raise UsageError(f"unknown batching strategy {strategy!r}; choose one of: {known}")
        self.units = make_units(units, seq_len=seq_len)
        if not self.units:
            raise UsageError("no training text: every unit has fewer than 2 tokens; give a corpus with more text")
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.strategy = strategy
        self.pad_id = pad_id
        self.shuffle = shuffle
        self.num_tokens = sum(len(u) - 1 for u in self.units)  # real targets per epoch
        self.epoch = 0
        self.cursor = 0  # index into this epoch's order of the next unit to take
        self._order: list[int] | None = None  # cached unit order for self.epoch
        self._group_ends: list[int] = []  # bucket only: sorted cursor values where a batch ends
        self._pending: list[int] = []  # pack only: deferred unit indices, first into the next batch

    def __len__(self) -> int:
        """Batches per epoch, rounded up (the stream itself is infinite).

        pack: a lower bound, real tokens / (batch_size * seq_len); how many batches an epoch really
        takes depends on how well the units fit (a few % more on the embedded corpus).
        """
        if self.strategy == "pack":
            return max(1, -(-self.num_tokens // (self.batch_size * self.seq_len)))
        return -(-len(self.units) // self.batch_size)

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            n = len(self.units)
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=gen).tolist() if self.shuffle else list(range(n))
            if self.strategy == "bucket":
                order = self._bucket_order(order, gen)
            self._order = order
        return self._order

    def _bucket_order(self, order: list[int], gen: torch.Generator) -> list[int]:
        """Sort by length (a stable sort: ties keep the random order), cut into groups, shuffle groups."""
        order = sorted(order, key=lambda i: len(self.units[i]))
        groups = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.shuffle:
            groups = [groups[g] for g in torch.randperm(len(groups), generator=gen).tolist()]
        self._group_ends = list(itertools.accumulate(len(g) for g in groups))
        return [i for g in groups for i in g]

    def _wrap_epoch(self) -> None:
        if self.cursor >= len(self.units):
            self.epoch += 1
            self.cursor = 0
            self._order = None

    def _next_index(self) -> int:
        self._wrap_epoch()
        index = self._epoch_order()[self.cursor]
        self.cursor += 1
        return index

    def _next_unit(self) -> torch.Tensor:
        return self.units[self._next_index()]

    def next_batch(self) -> Batch:
        """The next batch by the strategy (see the module docstring); advances the stream."""
        if self.strategy == "pack":
            return self._next_packed_batch()
        if self.strategy == "bucket":
            self._wrap_epoch()
            self._epoch_order()  # (re)builds this epoch's order and its group boundaries
            end = next(e for e in self._group_ends if e > self.cursor)
            chosen = [self._next_unit() for _ in range(end - self.cursor)]
        else:
            chosen = [self._next_unit() for _ in range(self.batch_size)]
        return collate_pad(chosen, pad_id=self.pad_id)

    def _next_packed_batch(self) -> Batch:
        """Best-fit units into `batch_size` rows, deferring misfits (see the module docstring).

        Never empty: the first deferred unit (or, with none, the first new unit) meets empty rows,
        and a unit has at most seq_len slots. Terminates: every placed unit fills >= 1 slot.
        """
        rows: list[list[torch.Tensor]] = [[] for _ in range(self.batch_size)]
        free = [self.seq_len] * self.batch_size

        def place(index: int) -> bool:
            unit = self.units[index]
            row = best_fit_row(free, len(unit) - 1)
            if row is not None:
                rows[row].append(unit)
                free[row] -= len(unit) - 1
            return row is not None

        # Deferred units first, in order; one that still fits nowhere (only after a smaller
        # batch_size on resume) keeps waiting.
        waiting = [i for i in self._pending if not place(i)]
        while len(waiting) < self.batch_size and max(free) > 0:
            index = self._next_index()
            if not place(index):
                waiting.append(index)
        self._pending = waiting
        used = [r for r in rows if r]  # rows left empty (tiny corpora) are not sent to the model
        return collate_pack(used, seq_len=self.seq_len, pad_id=self.pad_id)

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
            "pending": list(self._pending),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the saved sampler stopped.

        The data and its order must be the same (seed, shuffle, seq_len, unit and token counts);
        otherwise resuming would silently replay or skip data, so that is refused. `batch_size`
        and `strategy` may change between pad and pack (same unit order; the position is counted
        in units, not batches); bucket's order depends on both, so with bucket they must match.
        """
        for key in ("seed", "shuffle", "seq_len", "num_units", "num_tokens"):
            mine = len(self.units) if key == "num_units" else getattr(self, key)
            if state.get(key) != mine:
                raise UsageError(
                    f"cannot resume the data stream: saved {key}={state.get(key)!r} but this run has {mine!r}; "
                    "resume with the same corpus, tokenizer, seq_len and seed"
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
    corpus: Corpus,
    tokenizer: Tokenizer,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    val_fraction: float = 0.05,
    max_val_batches: int = 16,
    strategy: str = "pad",
    dedup: str = "none",
) -> TrainData:
    """Paragraphs -> dedup -> seeded train/val split -> train sampler and held-out batches.

    Dedup runs before the split so a duplicate can never sit on both sides (a held-out paragraph
    also seen in training would flatter the held-out loss). The validation batches cover the val
    paragraphs once, in corpus order, `batch_size` units each (the last one may be smaller), capped
    at `max_val_batches`. They are always padded, whatever `strategy`: the held-out set and its
    per-token loss are then identical across strategies (packing a fixed count of batches would
    cover more paragraphs and change what "held-out loss" measures).
    """
    _check_positive("max_val_batches", max_val_batches)
    kept, stats = apply_dedup(paragraphs(corpus), mode=dedup, count_tokens=lambda text: len(tokenizer.encode(text)))
    train_text, val_text = train_val_split(kept, val_fraction=val_fraction, seed=seed)
    train = BatchSampler(
        [tokenizer.encode(p) for p in train_text],
        batch_size=batch_size,
        seq_len=seq_len,
        seed=seed,
        strategy=strategy,
        pad_id=0,
    )
    val_units = make_units([tokenizer.encode(p) for p in val_text], seq_len=seq_len)
    starts = range(0, min(len(val_units), batch_size * max_val_batches), batch_size)
    val_batches = [collate_pad(val_units[s : s + batch_size], pad_id=0) for s in starts]
    return TrainData(train=train, val_batches=val_batches, dedup=stats)


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
