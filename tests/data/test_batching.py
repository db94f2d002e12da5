"""ampkit.data.batching: the Batch record and the helpers the samplers plan rows with."""

from __future__ import annotations

import pytest
import torch

from ampkit.data.batching import (
    BATCHING_STRATEGIES,
    COLLATORS,
    IGNORE_INDEX,
    Batch,
    best_fit_row,
    collate_pack,
    collate_pad,
)


def test_padding_fraction_counts_wasted_target_slots():
    batch = collate_pad([torch.arange(5), torch.arange(3)])  # 4 + 2 real targets in 2 x 4 slots
    assert (batch.n_tokens, batch.n_padded) == (6, 8)
    assert batch.padding_fraction == pytest.approx(0.25)
    empty = Batch(input_ids=torch.zeros(0, 0), targets=torch.zeros(0, 0), n_tokens=0, n_padded=0)
    assert empty.padding_fraction == 0.0


def test_to_keeps_counts_and_absent_tensors_absent():
    padded = collate_pad([torch.arange(4)]).to("cpu")
    assert padded.positions is None and padded.attn_mask is None and padded.n_tokens == 3
    packed = collate_pack([[torch.arange(3), torch.arange(2)]], seq_len=4).to(torch.device("meta"))
    assert {t.device.type for t in (packed.input_ids, packed.targets, packed.positions, packed.attn_mask)} == {"meta"}
    assert (packed.n_tokens, packed.n_padded) == (3, 4)


def test_pack_tail_is_its_own_segment_so_no_mask_row_is_empty():
    batch = collate_pack([[torch.tensor([1, 2, 3])]], seq_len=4)  # 2 real slots, 2 padding slots
    assert batch.targets.tolist() == [[2, 3, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch.positions.tolist() == [[0, 1, 0, 1]]
    mask = batch.attn_mask[0, 0]
    assert mask.any(dim=-1).all()  # every query attends to something (a fully masked row is NaN)
    assert not mask[2, :2].any() and mask[3, 2]  # the padding never looks into the document


def test_best_fit_takes_the_tightest_row_that_holds_the_unit():
    assert best_fit_row([10, 4, 6, 4], 4) == 1  # tightest fit; the lower index on a tie
    assert best_fit_row([10, 4, 6], 5) == 2
    assert best_fit_row([3, 2], 4) is None
    assert best_fit_row([], 1) is None


def test_every_one_unit_per_row_strategy_has_a_collator():
    assert set(COLLATORS) == set(BATCHING_STRATEGIES) - {"pack"}
    assert all(collate is collate_pad for collate in COLLATORS.values())
