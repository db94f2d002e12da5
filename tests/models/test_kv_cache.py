"""The built-in decoder's KV-cache decode path: cached logits equal a full recompute, in every
weight precision and KV dtype; the cache's bytes are the formula's exactly."""

from __future__ import annotations

import pytest
import torch

from ampkit.models import build_model, get_preset
from ampkit.models.kv_cache import KVCache

CFG = get_preset("tiny")
# (weights, KV dtype, tolerance on the logits vs the full recompute in the same weights)
CASES = [
    (torch.float32, torch.float32, 1e-4),
    (torch.float32, torch.bfloat16, 0.1),
    (torch.float16, torch.float16, 0.05),
    (torch.bfloat16, torch.bfloat16, 0.25),
    (torch.float32, torch.float8_e4m3fn, 0.5),
]


@pytest.mark.parametrize(("weights", "kv", "tolerance"), CASES)
def test_prefill_then_decode_equals_the_full_forward(weights, kv, tolerance):
    model = build_model(CFG, seed=0).to(weights).eval()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).float()
        cache = model.new_cache(batch_size=2, max_len=32, dtype=kv)
        pieces = [model.forward_cached(ids[:, :16], cache)]
        pieces += [model.forward_cached(ids[:, t : t + 1], cache) for t in range(16, 24)]
    cached = torch.cat(pieces, dim=1).float()
    assert cache.length == 24
    assert (cached - full).abs().max().item() < tolerance
    assert torch.equal(cached.argmax(-1)[:, -8:], full.argmax(-1)[:, -8:]) or kv != weights


@pytest.mark.parametrize("kv", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn])
def test_bytes_per_token_are_the_formulas(kv):
    cache = KVCache(CFG, batch_size=3, max_len=10, dtype=kv)
    assert cache.bytes_per_token() == 2 * CFG.n_layers * CFG.kv_heads * CFG.head_dim * kv.itemsize
    assert cache.nbytes == cache.bytes_per_token() * 3 * 10


def test_the_cache_refuses_tokens_past_its_length_and_the_model_past_its_positions():
    model = build_model(CFG, seed=0).eval()
    cache = model.new_cache(batch_size=1, max_len=4, dtype=torch.float32)
    with torch.no_grad(), pytest.raises(ValueError, match="holds 4 tokens"):
        model.forward_cached(torch.zeros(1, 5, dtype=torch.long), cache)
    long = model.new_cache(batch_size=1, max_len=CFG.max_seq_len + 1, dtype=torch.float32)
    long.length = CFG.max_seq_len
    with torch.no_grad(), pytest.raises(ValueError, match="exceed the model's"):
        model.forward_cached(torch.zeros(1, 1, dtype=torch.long), long)
