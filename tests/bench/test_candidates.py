"""Bench candidates: a precision, optionally with its own optimizer ('bf16-true+adamw-sr')."""

from __future__ import annotations

import pytest

from ampkit.bench.candidates import candidate_rank, candidate_spec, canonical_candidate, split_candidate
from ampkit.bench.config import BenchConfig, parse_precisions
from ampkit.bench.worker import train_config_for
from ampkit.errors import UsageError
from ampkit.precision import get_spec


def test_names_are_canonical_and_split():
    assert canonical_candidate(" BF16-True + AdamW-SR ") == "bf16-true+adamw-sr"
    assert canonical_candidate("bf16") == "bf16-mixed"  # a plain alias as before
    assert split_candidate("bf16-true+adamw-sr") == ("bf16-true", "adamw-sr")
    assert split_candidate("fp32") == ("fp32", None)
    assert candidate_spec("bf16-true+adamw-kahan") == get_spec("bf16-true")
    assert candidate_rank("bf16-true+adamw-sr") == get_spec("bf16-true").simplicity + 0.5


@pytest.mark.parametrize(("text", "word"), [("bf16-true+adam", "unknown optimizer 'adam'"), ("bf17+adamw", "bf17")])
def test_unknown_parts_are_refused_in_one_line(text, word):
    with pytest.raises(UsageError, match=word):
        parse_precisions(text)


def test_the_worker_trains_the_candidate_with_its_optimizer():
    config = BenchConfig.of(precisions="fp32,bf16-true,bf16-true+adamw-sr", model="tiny", batch_size=2, seq_len=32)
    assert parse_precisions(config.precisions) == ["fp32", "bf16-true", "bf16-true+adamw-sr"]
    sr = train_config_for(config, "bf16-true+adamw-sr")
    plain = train_config_for(config, "bf16-true")
    assert (sr.precision, sr.optimizer.optimizer) == ("bf16-true", "adamw-sr")
    assert (plain.precision, plain.optimizer.optimizer) == ("bf16-true", "adamw")
