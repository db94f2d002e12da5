"""ampkit.models.config: the Llama-style shape, its checks and its exact parameter count."""

from __future__ import annotations

import pytest

from ampkit.errors import UsageError
from ampkit.models import LlamaLM
from ampkit.models.config import ModelConfig


def test_parameter_count_matches_the_built_model_with_gqa_and_an_untied_head():
    cfg = ModelConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24)
    model = LlamaLM(cfg)
    assert cfg.num_parameters() == sum(p.numel() for p in model.parameters())
    assert cfg.num_parameters(include_embedding=False) == cfg.num_parameters() - 50 * 16
    assert (cfg.head_dim, cfg.kv_heads) == (4, 2)


def test_kv_heads_default_to_the_query_heads():
    assert ModelConfig(d_model=16, n_layers=1, n_heads=4, d_ff=8).kv_heads == 4


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"d_model": 0}, "d_model must be positive"),
        ({"n_heads": 3}, "not divisible by n_heads"),
        ({"d_model": 12, "n_heads": 4}, "head dim 3 must be even"),
        ({"n_kv_heads": 3}, "multiple of n_kv_heads 3"),
    ],
)
def test_impossible_shapes_are_usage_errors(shape, message):
    with pytest.raises(UsageError, match=message):
        ModelConfig(**{"d_model": 16, "n_layers": 1, "n_heads": 4, "d_ff": 8, **shape})


def test_to_dict_holds_every_field():
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=4, d_ff=8)
    assert ModelConfig(**cfg.to_dict()) == cfg
