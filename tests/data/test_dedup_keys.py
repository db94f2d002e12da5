"""ampkit.data.dedup: what counts as the same text, and the mode check."""

from __future__ import annotations

import pytest

from ampkit.data.dedup import DEDUP_MODES, apply_dedup, check_dedup_mode, text_key


def test_key_is_equal_exactly_when_the_normalized_texts_are():
    assert text_key("a  b\n\tc ") == text_key(" a b c")
    assert text_key("a b c") != text_key("a b c.")
    assert text_key("Note") != text_key("note")  # case matters
    assert len(text_key("anything")) == 16


def test_the_level_and_the_token_count_reach_the_stats():
    kept, stats = apply_dedup(
        ["one two", "one  two", "three"], mode="exact", count_tokens=lambda t: len(t.split()), level="document"
    )
    assert kept == ["one two", "three"]
    assert stats.level == "document" and stats.tokens_before == 5 and stats.tokens_removed == 2


@pytest.mark.parametrize("mode", DEDUP_MODES)
def test_known_modes_pass_the_check(mode):
    check_dedup_mode(mode)
