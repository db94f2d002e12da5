"""One seeded batch stream dealt out to the ranks.

Rank r of W takes batches r, r + W, r + 2W, ... of the very stream a one-process run reads. So a
W-rank step of `grad_accum` micro-batches consumes the same W * grad_accum consecutive batches as a
one-process step with `grad_accum * W` micro-batches: the **global batch** is
`world_size * grad_accum * batch_size` sequences, and a one-process run with `--grad-accum
(grad_accum * world_size)` sees the same data in every step (the equivalence the tests check).

Every rank draws all W batches of a round and keeps one. A stream with `skip_batch()` (ampkit's
`BatchSampler`) skips the others without reading their tokens, returning their token account
(trained, processed, slots); so from token shards each rank reads only its own windows, the ranks'
shares are disjoint and together they read every window once per epoch. A stream without it builds
the others' batches and counts them with the task's `count`. Either way the position is the same
on every rank, resuming needs no coordination, and each rank knows every rank's token count without
a collective (the loss weights need them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ampkit.core.counts import NO_COUNTS, Counts, as_counts
from ampkit.errors import UsageError


class RankShardedSampler:
    """Wraps a task's batch stream: `next_batch()` returns this rank's batch of the next round of W;
    `count` is the task's `count(batch)` (host ints: `Counts`, or an older task's (items, slots))."""

    def __init__(self, inner, *, rank: int, world_size: int, count: Callable[[Any], Any]):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.inner, self.rank, self.world_size, self.count = inner, rank, world_size, count
        self._counts = NO_COUNTS  # every rank's token account drawn since take_step_counts()

    def next_batch(self):
        skip = getattr(self.inner, "skip_batch", None)
        mine = None
        for r in range(self.world_size):
            if r == self.rank or skip is None:
                batch = self.inner.next_batch()
                mine = batch if r == self.rank else mine
                self._counts = self._counts + as_counts(self.count(batch))
            else:
                trained, processed, slots = skip()
                self._counts = self._counts + Counts(trained=trained, processed=processed, slots=slots)
        return mine

    def take_step_counts(self) -> Counts:
        """The token account (trained, processed, slots) of every rank's batches since the last
        call; resets."""
        counts, self._counts = self._counts, NO_COUNTS
        return counts

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Same stream position; refused at another world size (the batches would be dealt differently)."""
        if state.get("world_size") != self.world_size:
            raise UsageError(
                f"the checkpoint was written by {state.get('world_size')} ranks and this job has "
                f"{self.world_size}: resume with the same number of processes (see docs/distributed.md)"
            )
        self.inner.load_state_dict(state["inner"])
        self._counts = NO_COUNTS
