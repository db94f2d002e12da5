"""Turning a list of token units into one training `Batch`.

A *unit* is a 1-D LongTensor of at least 2 token ids (a paragraph, or one chunk of a long one).
Within a unit, the target of position t is token t + 1; targets never cross unit boundaries.
A unit's *labels* (same length) say which tokens carry a loss: the target of position t is
labels[t + 1], IGNORE_INDEX where the loss is skipped (a prompt, a user turn: `ampkit.data.samples`).
Text trained everywhere passes no labels (its labels are the unit itself, the same tensor). Every
strategy copies the labels exactly where it copies the tokens, so masks survive padding, bucketing
and packing alike; `n_tokens` counts the targets that carry a loss.

Strategies (`BATCHING_STRATEGIES`; which units go into a batch is the sampler's job, see sampler.py):
- "pad": each unit is one row; rows are right-padded to the batch's longest unit minus one, and
  padded target slots hold IGNORE_INDEX so the loss skips them.
- "bucket": rows exactly as "pad" (`collate_pad`); the sampler puts units of similar length in the
  same batch, so there is little to pad.
- "pack": several units share one row of exactly `seq_len` slots (`collate_pack`). Each unit is a
  *segment* of len(unit) - 1 slots laid out exactly as a "pad" row would hold it (inputs unit[:-1],
  targets unit[1:]), so a target never crosses a document boundary and pack trains on exactly the
  (input, target) pairs pad does. Document isolation: positions restart at 0 in every segment, and
  the attention mask is block-diagonal causal (a token sees only earlier tokens of its own segment).
  The unused tail of a row is padding: targets IGNORE_INDEX, and it forms its own segment so no row
  of the mask is all-False (a fully masked softmax row is NaN in some SDPA kernels).
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
    """Number of target slots with a loss (neither padding nor masked): what the loss averages over
    and tokens/s counts."""
    n_padded: int
    """Total target slots, B * T, real or not: what the hardware actually computes."""
    n_processed: int | None = None
    """Target slots that are not padding, with a loss or masked (a prompt's): the tokens the model
    really read; None: as many as `n_tokens` (a batch without masks)."""
    positions: torch.Tensor | None = None
    """Per-token position ids (B, T) for packed rows; None means 0..T-1 in every row."""
    attn_mask: torch.Tensor | None = None
    """Attention mask for packed rows (document isolation); None means plain causal attention."""

    @property
    def processed(self) -> int:
        """Target slots that are not padding (`n_processed`, or `n_tokens` without masks)."""
        return self.n_tokens if self.n_processed is None else self.n_processed

    @property
    def padding_fraction(self) -> float:
        """Share of target slots that are padding: 1 - processed / n_padded (0.0 = no waste)."""
        return 1.0 - self.processed / self.n_padded if self.n_padded else 0.0

    def head(self, rows: int) -> Batch:
        """The first `rows` rows, counts recomputed (fidelity compares a few rows)."""
        if self.input_ids.shape[0] <= rows:
            return self
        targets = self.targets[:rows]
        return replace(
            self,
            input_ids=self.input_ids[:rows],
            targets=targets,
            n_tokens=int((targets != IGNORE_INDEX).sum()),
            n_processed=None,  # per-row lengths are not kept; fidelity reads the trained targets only
            n_padded=targets.numel(),
            positions=None if self.positions is None else self.positions[:rows],
            attn_mask=None if self.attn_mask is None else self.attn_mask[:rows],
        )

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on `device` (the counts stay host-side ints: no sync needed)."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        def move_optional(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else move(t)

        return replace(
            self,
            input_ids=move(self.input_ids),
            targets=move(self.targets),
            positions=move_optional(self.positions),
            attn_mask=move_optional(self.attn_mask),
        )


def collate_pad(
    units: Sequence[torch.Tensor], *, pad_id: int = 0, labels: Sequence[torch.Tensor] | None = None
) -> Batch:
    """One row per unit, right-padded to the longest unit minus one (so T <= longest - 1).
    `labels`: one per unit (module docstring); None: every token carries a loss."""
    if not units:
        raise ValueError("collate_pad needs at least one unit")
    labels = units if labels is None else labels
    width = max(len(u) for u in units) - 1  # T: a unit of n tokens gives n - 1 (input, target) pairs
    input_ids = torch.full((len(units), width), pad_id, dtype=torch.long)
    targets = torch.full((len(units), width), IGNORE_INDEX, dtype=torch.long)
    processed = 0
    for row, (unit, label) in enumerate(zip(units, labels, strict=True)):
        n = len(unit) - 1
        input_ids[row, :n] = unit[:-1]
        targets[row, :n] = label[1:]
        processed += n
    n_tokens = int((targets != IGNORE_INDEX).sum())
    return Batch(
        input_ids=input_ids, targets=targets, n_tokens=n_tokens, n_padded=input_ids.numel(), n_processed=processed
    )


def collate_pack(
    rows: Sequence[Sequence[torch.Tensor]],
    *,
    seq_len: int,
    pad_id: int = 0,
    labels: Sequence[Sequence[torch.Tensor]] | None = None,
) -> Batch:
    """One row of exactly `seq_len` slots per list of units; each unit fills len(unit) - 1 slots.
    `labels`: shaped like `rows`, one per unit (module docstring); None: every token carries a loss.

    Fails (ValueError) if a row's units need more than `seq_len` slots: planning rows is the
    sampler's job (`best_fit_row`), and a silent truncation here would drop targets.
    """
    if not rows:
        raise ValueError("collate_pack needs at least one row")
    labels = rows if labels is None else labels
    B, T = len(rows), seq_len
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    targets = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros((B, T), dtype=torch.long)
    segment = torch.zeros((B, T), dtype=torch.long)  # segment index of every slot within its row
    processed = 0
    for r, (units, row_labels) in enumerate(zip(rows, labels, strict=True)):
        start = 0
        for s, (unit, label) in enumerate(zip(units, row_labels, strict=True)):
            n = len(unit) - 1
            if n < 1 or start + n > T:
                raise ValueError(f"row {r} needs more than seq_len={T} slots (or holds a unit of < 2 tokens)")
            input_ids[r, start : start + n] = unit[:-1]
            targets[r, start : start + n] = label[1:]
            positions[r, start : start + n] = torch.arange(n)
            segment[r, start : start + n] = s
            start += n
        processed += start
        # The padding tail is one more segment, with its own positions (see the module docstring).
        positions[r, start:] = torch.arange(T - start)
        segment[r, start:] = len(units)
    return Batch(
        input_ids=input_ids,
        targets=targets,
        n_tokens=int((targets != IGNORE_INDEX).sum()),
        n_padded=B * T,
        n_processed=processed,
        positions=positions,
        attn_mask=document_causal_mask(segment),
    )


def document_causal_mask(segment: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask (B, 1, T, T), bool, True = may attend, from segment ids (B, T).

    Slot i may attend to slot j iff j <= i and both lie in the same segment. Memory: B * T * T
    bytes (8 MiB for B=32, T=512), built once per batch on the host.
    """
    T = segment.shape[1]
    same = segment[:, :, None] == segment[:, None, :]  # (B, T, T)
    causal = torch.ones((T, T), dtype=torch.bool).tril()
    return (same & causal).unsqueeze(1)


def best_fit_row(free_slots: Sequence[int], need: int) -> int | None:
    """The row with the fewest free slots that still holds `need` (lowest index on ties), or None.

    Best-fit keeps large gaps open for large units; on the embedded corpus at seq_len 512 it wastes
    less than first-fit (with the sampler's deferral: 2.7% vs 3.6% of slots).
    """
    best = None
    for row, free in enumerate(free_slots):
        if free >= need and (best is None or free < free_slots[best]):
            best = row
    return best


Collator = Callable[..., Batch]

COLLATORS: dict[str, Collator] = {"pad": collate_pad, "bucket": collate_pad}
"""Strategy name -> collate function(units, *, pad_id) -> Batch, for the strategies whose rows hold
one unit each. "pack" rows hold several units: see `collate_pack`."""

BATCHING_STRATEGIES = ("pad", "bucket", "pack")
"""Every batching strategy, in the order reports list them (pad is the baseline)."""
