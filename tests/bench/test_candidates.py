"""Bench candidates: a precision, optionally with its own optimizer ('bf16-true+adamw-sr')."""

from __future__ import annotations

import math

import pytest
import torch

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


def test_a_per_part_candidate_is_a_precision_with_module_overrides():
    from ampkit.bench.candidates import candidate_overrides

    name = canonical_candidate(" BF16-True + adamw-sr @ vision @ blocks.*.mlp=bf16-true ")
    assert name == "bf16-true+adamw-sr@vision=fp32@blocks.*.mlp=bf16-true"  # '@P' is '@P=fp32', as --keep-fp32
    assert split_candidate(name) == ("bf16-true", "adamw-sr") and candidate_spec(name) == get_spec("bf16-true")
    assert str(candidate_overrides(name)) == "vision=fp32,blocks.*.mlp=bf16-true"
    assert not candidate_overrides("bf16-true+adamw-sr")
    plain, island = get_spec("bf16-mixed").simplicity, candidate_rank("bf16-mixed@head=fp32")
    assert plain < island < get_spec("fp16-mixed").simplicity  # one moving part more, never the next precision
    assert parse_precisions("bf16-mixed,bf16-mixed@head") == ["fp32", "bf16-mixed", "bf16-mixed@head=fp32"]


@pytest.mark.parametrize(
    ("text", "word"),
    [("bf16-mixed@", "needs PATTERN=REGIME"), ("bf16-mixed@x=bf16", "not a module regime"), ("fp32@x", "reference")],
)
def test_bad_per_part_candidates_are_refused_in_one_line(text, word):
    with pytest.raises(UsageError, match=word):
        parse_precisions(text)


def test_a_per_part_candidate_trains_with_its_island_and_a_bad_pattern_stops_before_any_worker():
    from ampkit.bench.runner import plan_bench
    from ampkit.bench.worker import build_for

    config = BenchConfig.of(
        precisions="bf16-mixed@blocks.*.mlp=fp32", keep_fp32="norm", model="tiny", batch_size=2, seq_len=16
    )
    worker = train_config_for(config, "bf16-mixed@blocks.*.mlp=fp32")
    assert (worker.precision, worker.module_precision, worker.keep_fp32) == ("bf16-mixed", "blocks.*.mlp=fp32", "norm")
    objs = build_for({"precision": "bf16-mixed@blocks.*.mlp=fp32"}, config, {"batch_size": 2})
    islands = {f"blocks.{i}.mlp": "fp32" for i in range(len(objs.model.blocks))}
    assert objs.policy.overridden == islands | {"norm": "fp32"}
    seen = []
    objs.model.blocks[0].mlp.down_proj.register_forward_hook(lambda m, a, o: seen.append(o.dtype))
    result = objs.trainer.train_step()
    assert seen == [torch.float32] and math.isfinite(float(result.loss))
    assert objs.features_summary()["module_precision"]["modules"] == objs.policy.overridden
    bad = BenchConfig.of(precisions="bf16-mixed@blocks.*.nope", model="tiny", batch_size=2, seq_len=16)
    with pytest.raises(UsageError, match=r"'blocks.\*.nope' matches no module"):
        plan_bench(bad)
