"""ampkit.models.presets: the named shapes and their lookup."""

from __future__ import annotations

import pytest

from ampkit.errors import UsageError
from ampkit.models.presets import PRESETS, get_preset


@pytest.mark.parametrize(
    ("name", "millions"),
    [("tiny", 0.9), ("small", 25), ("gpt2-124m", 124), ("1b", 1236), ("7b", 6738), ("13b", 13016), ("70b", 68977)],
)
def test_presets_have_the_sizes_their_names_and_comments_claim(name, millions):
    assert PRESETS[name].name == name
    assert PRESETS[name].num_parameters() / 1e6 == pytest.approx(millions, rel=0.1)  # the comments round


def test_lookup_ignores_case_and_applies_overrides():
    assert get_preset("TINY") is PRESETS["tiny"]
    bigger = get_preset("tiny", vocab_size=512)
    assert bigger.vocab_size == 512 and bigger.d_model == PRESETS["tiny"].d_model
    assert PRESETS["tiny"].vocab_size == 256  # the table itself is untouched


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown model preset 'huge'; choose one of: tiny, small"):
        get_preset("huge")
