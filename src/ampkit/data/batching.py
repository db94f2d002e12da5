"""Turning a list of token units into one training `Batch`.

A *unit* is a 1-D LongTensor of at least 2 token ids (a paragraph, or one chunk of a long one).
Within a unit, the target of position t is token t + 1; targets never cross unit boundaries.

Strategies (the seam for later work; only "pad" exists now):
- "pad": each unit is one row; rows are right-padded to the batch's longest unit minus one, and
  padded target slots hold IGNORE_INDEX so the loss skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

IGNORE_INDEX = -100
"""Target value the loss ignores (the default `ignore_index` of `torch.nn.functional.cross_entropy`)."""


@dataclass(kw_only=True)
class Batch:
    """One training or evaluation batch."""

    input_ids: torch.Tensor
    """Token ids, LongTensor of shape (B, T); padding slots hold the sampler's pad_id."""
    targets: torch.Tensor
    """Next-token ids, LongTensor (B, T); IGNORE_INDEX (-100) where there is nothing to predict."""
    n_tokens: int
    """Number of real (non-ignored) target slots: the tokens that tokens/s counts."""
    n_padded: int
    """Total target slots, B * T, real or not: what the hardware actually computes."""
    positions: torch.Tensor | None = None
    """Per-token position ids (B, T) for packed rows; None means 0..T-1 in every row."""
    attn_mask: torch.Tensor | None = None
    """Attention mask for packed rows (document isolation); None means plain causal attention."""

    @property
    def padding_fraction(self) -> float:
        """Share of target slots that are padding: 1 - n_tokens / n_padded (0.0 = no waste)."""
        return 1.0 - self.n_tokens / self.n_padded if self.n_padded else 0.0

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on `device` (the counts stay host-side ints: no sync needed)."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return replace(
            self,
            input_ids=move(self.input_ids),
            targets=move(self.targets),
            positions=move(self.positions),
            attn_mask=move(self.attn_mask),
        )


def collate_pad(units: Sequence[torch.Tensor], *, pad_id: int = 0) -> Batch:
    """One row per unit, right-padded to the longest unit minus one (so T <= longest - 1)."""
    if not units:
        raise ValueError("collate_pad needs at least one unit")
    width = max(len(u) for u in units) - 1  # T: a unit of n tokens gives n - 1 (input, target) pairs
    input_ids = torch.full((len(units), width), pad_id, dtype=torch.long)
    targets = torch.full((len(units), width), IGNORE_INDEX, dtype=torch.long)
    n_tokens = 0
    for row, unit in enumerate(units):
        n = len(unit) - 1
        input_ids[row, :n] = unit[:-1]
        targets[row, :n] = unit[1:]
        n_tokens += n
    return Batch(input_ids=input_ids, targets=targets, n_tokens=n_tokens, n_padded=input_ids.numel())


Collator = Callable[..., Batch]

COLLATORS: dict[str, Collator] = {"pad": collate_pad}
"""Batching strategy name -> collate function(units, *, pad_id) -> Batch."""
