"""ampkit.diagnostics.locator: the |x| statistics of one site (what the locator records per frame)."""

from __future__ import annotations

import math

import torch

from ampkit.diagnostics.locator import _RowCache, tensor_stats


def test_stats_combine_every_floating_tensor_and_skip_the_rest():
    a = torch.tensor([0.0, -3.0, float("inf"), float("nan")])
    b = torch.tensor([40000.0, 2.0**-30], dtype=torch.float32)
    stats = tensor_stats([a, b, torch.tensor([7, 8]), "not a tensor"])
    assert stats.numel == 6 and stats.dtype == "float32"
    assert (stats.n_nan, stats.n_inf) == (1, 1)
    assert stats.absmax == 40000.0  # the largest *finite* |x|
    assert stats.absmin == 2.0**-30
    assert stats.near_max == 1  # 40000 > 65504 / 2
    assert stats.fp16_flush == 1  # 2^-30 becomes 0 in fp16


def test_no_floating_tensor_means_no_stats():
    assert tensor_stats([torch.tensor([1, 2])]) is None
    assert tensor_stats([]) is None


def test_the_row_cache_measures_a_tensor_again_after_an_in_place_write():
    cache, t = _RowCache(), torch.tensor([1.0, 2.0])
    first = cache.stats([t])
    assert first == tensor_stats([t]) and cache.stats([t]) == first  # the second call is served from the cache
    t.mul_(float("inf"))
    again = cache.stats([t])
    assert again.n_inf == 2 and math.isfinite(first.absmax)
