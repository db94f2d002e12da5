"""Decoder-layer patterns: identical layers, a repeating period, a prefix; shallow copies of a config."""

from __future__ import annotations

import pytest
import torch

from ampkit.models.hf import decoder_layers
from ampkit.plan.describe.layers import (
    LayerPattern,
    check_copy,
    config_at_depth,
    find_pattern,
    layer_signatures,
    model_pattern,
)
from hf_archs import tiny_config

transformers = pytest.importorskip("transformers")


def pattern_of(kinds: str) -> LayerPattern:
    return find_pattern([(k,) for k in kinds])


@pytest.mark.parametrize(
    ("kinds", "prefix", "period", "remainder"),
    [
        ("AAAAAAAA", 0, 1, 0),
        ("ABABABAB", 0, 2, 0),
        ("ABABABA", 0, 2, 1),
        ("ABBBBBBB", 1, 1, 0),
        ("AAAAABAAAAAB", 0, 6, 0),
        ("AB", 1, 1, 0),
    ],
)
def test_shortest_prefix_and_period(kinds, prefix, period, remainder):
    p = pattern_of(kinds)
    assert (p.prefix, p.period, p.remainder) == (prefix, period, remainder)
    assert p.depth(p.repeats) == len(kinds)
    assert p.identical == (prefix == 0 and period == 1)


def test_few_repeats_are_not_extrapolated():
    assert pattern_of("A" * 4).extrapolable and not pattern_of("AAA").extrapolable
    assert not pattern_of("ABAB").extrapolable  # two periods: tracing in full costs as much
    assert "no repeating pattern" not in pattern_of("AB" * 6).describe()


def meta(config):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def test_identical_llama_and_alternating_gemma2():
    llama = tiny_config("llama", layers=8)
    assert model_pattern(decoder_layers(meta(llama)), llama).identical
    gemma2 = tiny_config("gemma2", layers=8)  # sliding-window and global attention alternate
    p = model_pattern(decoder_layers(meta(gemma2)), gemma2)
    assert (p.prefix, p.period, p.repeats) == (0, 2, 4) and not p.identical
    assert "pattern of 2" in p.describe()


def test_a_shallow_copy_keeps_the_pattern_and_cuts_per_layer_lists():
    config = tiny_config("gemma2", layers=8)
    signatures = layer_signatures(decoder_layers(meta(config)), config)
    copy = config_at_depth(config, 4)
    assert copy.num_hidden_layers == 4 and len(copy.layer_types) == 4 and config.num_hidden_layers == 8
    assert check_copy(signatures, decoder_layers(meta(copy)), copy)


def test_a_copy_that_moves_layers_by_index_is_caught():
    config = tiny_config("qwen3_moe", layers=8, mlp_only_layers=[5])  # layer 5 dense, placed by index
    signatures = layer_signatures(decoder_layers(meta(config)), config)
    p = find_pattern(signatures)
    assert not p.identical  # the pattern is "AAAAABAA": the shortest description is the whole model
    copy = config_at_depth(config, 6)
    assert check_copy(signatures, decoder_layers(meta(copy)), copy)  # layers 0..5 as in the model
    shifted = config_at_depth(tiny_config("qwen3_moe", layers=8, mlp_only_layers=[1]), 6)
    assert not check_copy(signatures, decoder_layers(meta(shifted)), shifted)
