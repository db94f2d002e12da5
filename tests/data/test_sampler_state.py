"""ampkit.data.sampler: the resumable position of a BatchSampler and its argument checks."""

from __future__ import annotations

import pytest

from ampkit.data.sampler import BatchSampler, make_units
from ampkit.errors import UsageError

UNITS = [list(range(i * 100, i * 100 + 3 + i % 7)) for i in range(30)]


def _sampler(**overrides) -> BatchSampler:
    return BatchSampler(UNITS, **{"batch_size": 4, "seq_len": 8, "seed": 3, **overrides})


def test_state_counts_units_so_pad_resumes_as_pack_on_the_same_order():
    first = _sampler()
    for _ in range(3):
        first.next_batch()
    state = first.state_dict()
    assert (state["epoch"], state["cursor"]) == (0, 12)
    resumed = _sampler(strategy="pack", batch_size=2)
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.cursor) == (0, 12)
    unit = first.units[first._epoch_order()[12]]  # the next unit pad would have taken
    batch = resumed.next_batch()
    assert batch.input_ids[0, : len(unit) - 1].tolist() == unit[:-1].tolist()  # pack starts a row with it


def test_a_corrupt_position_is_refused():
    state = _sampler().state_dict()
    with pytest.raises(ValueError, match="corrupt sampler state"):
        _sampler().load_state_dict({**state, "cursor": len(make_units(UNITS, seq_len=8)) + 1})


@pytest.mark.parametrize("value", [True, 0, 2.0])
def test_batch_size_must_be_a_whole_positive_number(value):
    with pytest.raises(UsageError, match="batch_size must be a positive integer"):
        _sampler(batch_size=value)
