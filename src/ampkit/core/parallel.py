"""The data-parallel hooks the training step calls, and their one-process "off" object.

`Trainer.train_step` calls these hooks unconditionally and never asks whether the run is distributed:
`LocalRun` does nothing (one process), `ampkit.distributed.context.ProcessGroupRun` overrides each one
with its collective. The contract lives here, beside the step, so the step imports no torch.distributed
code (the distributed package implements it, above this layer).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ampkit.core.counts import Counts


class LocalRun:
    """A one-process run: every data-parallel hook does nothing (the "off" object).

    The training loop and the run call these hooks unconditionally; `ProcessGroupRun` overrides them.
    """

    mode = "none"
    rank = 0
    local_rank = 0
    world_size = 1
    distributed = False

    @property
    def is_main(self) -> bool:
        """Whether this process logs, writes summaries and shows progress (rank 0)."""
        return self.rank == 0

    def micro_batch_context(self, *, last: bool) -> contextlib.AbstractContextManager:
        """Wraps one micro-batch's forward and backward; DDP skips its all-reduce unless `last`."""
        return contextlib.nullcontext()

    def step_counts(self, counts: Counts) -> Counts:
        """The token account (`ampkit.core.counts`) of this step's micro-batches on every rank."""
        return counts

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of `value` over ranks (a collective)."""
        return value

    def agreed_signal(self, signum: int | None, *, check: bool) -> int | None:
        """A stop signal every rank acts on at the same step; ranks agree only when `check`."""
        return signum

    def all_true(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (a collective)."""
        return flag

    def barrier(self) -> None:
        """Wait for every rank."""

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (picklable objects only)."""
        return obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        return [obj]

    def describe(self) -> dict[str, Any]:
        """The summary's "parallel" section."""
        return {"mode": self.mode, "world_size": self.world_size}

    def close(self, *, clean: bool = True) -> None:
        """Tear down the process group (nothing to do here)."""
