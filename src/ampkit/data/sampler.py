"""A deterministic, seeded, resumable, infinite stream of batches over tokenized units.

Order of operations: paragraphs -> tokens -> units (`make_units`) -> epoch permutation ->
`batch_size` units at a time -> collate by strategy -> `Batch`.

Determinism: epoch e visits units in `torch.randperm(N, generator=Generator().manual_seed(seed + e))`
order, with its own generator, so the global torch RNG is never read or advanced. The position in
the stream is just (epoch, cursor): `state_dict()` / `load_state_dict()` restore it exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ampkit.data.batching import COLLATORS, Batch
from ampkit.data.corpus import Corpus, paragraphs, train_val_split
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
    """Infinite stream of `Batch`es: `batch_size` units per batch, epochs wrap seamlessly.

    A batch may straddle two epochs (the tail of one permutation and the head of the next), so
    every batch has exactly `batch_size` rows. `shuffle=False` visits units in the given order.
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
        if strategy not in COLLATORS:
            known = ", ".join(sorted(COLLATORS))
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
        self._order: list[int] | None = None  # cached permutation for self.epoch

    def __len__(self) -> int:
        """Batches per epoch, rounded up (the stream itself is infinite)."""
        return -(-len(self.units) // self.batch_size)

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            n = len(self.units)
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed + self.epoch)
                self._order = torch.randperm(n, generator=gen).tolist()
            else:
                self._order = list(range(n))
        return self._order

    def _next_unit(self) -> torch.Tensor:
        if self.cursor >= len(self.units):
            self.epoch += 1
            self.cursor = 0
            self._order = None
        unit = self.units[self._epoch_order()[self.cursor]]
        self.cursor += 1
        return unit

    def next_batch(self) -> Batch:
        """The next `batch_size` units, collated by the strategy; advances the stream."""
        chosen = [self._next_unit() for _ in range(self.batch_size)]
        return COLLATORS[self.strategy](chosen, pad_id=self.pad_id)

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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the saved sampler stopped.

        The data and its order must be the same (seed, shuffle, seq_len, unit and token counts);
        otherwise resuming would silently replay or skip data, so that is refused. `batch_size`
        and `strategy` may change: the position is counted in units, not batches.
        """
        for key in ("seed", "shuffle", "seq_len", "num_units", "num_tokens"):
            mine = len(self.units) if key == "num_units" else getattr(self, key)
            if state.get(key) != mine:
                raise UsageError(
                    f"cannot resume the data stream: saved {key}={state.get(key)!r} but this run has {mine!r}; "
                    "resume with the same corpus, tokenizer, seq_len and seed"
                )
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor <= len(self.units):
            raise ValueError(f"corrupt sampler state: epoch={epoch}, cursor={cursor}")
        self.epoch, self.cursor, self._order = epoch, cursor, None


def build_samplers(
    corpus: Corpus,
    tokenizer: Tokenizer,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    val_fraction: float = 0.05,
    max_val_batches: int = 16,
    strategy: str = "pad",
) -> tuple[BatchSampler, list[Batch]]:
    """Train sampler and a fixed list of held-out batches, split by paragraph (seeded).

    The validation batches cover the val paragraphs once, in corpus order, `batch_size` units
    each (the last one may be smaller), capped at `max_val_batches`. They are built once so
    every evaluation sees the same tokens.
    """
    _check_positive("max_val_batches", max_val_batches)
    train_text, val_text = train_val_split(paragraphs(corpus), val_fraction=val_fraction, seed=seed)
    train = BatchSampler(
        [tokenizer.encode(p) for p in train_text],
        batch_size=batch_size,
        seq_len=seq_len,
        seed=seed,
        strategy=strategy,
        pad_id=0,
    )
    val_units = make_units([tokenizer.encode(p) for p in val_text], seq_len=seq_len)
    collate = COLLATORS[strategy]
    starts = range(0, min(len(val_units), batch_size * max_val_batches), batch_size)
    val_batches = [collate(val_units[s : s + batch_size], pad_id=0) for s in starts]
    return train, val_batches


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {value!r}; pass a whole number >= 1")
