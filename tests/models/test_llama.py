"""The built-in Llama-style model: exact parameter counts, causality, fp32 where it matters."""

from __future__ import annotations

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.models import PRESETS, ModelConfig, build_model, causal_lm_loss, get_preset
from ampkit.models.flops import training_flops_per_token
from ampkit.models.llama import rope_angles

CPU_BUILDABLE = ["tiny", "small"]


def _count(model):
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


@pytest.mark.parametrize("name", CPU_BUILDABLE)
def test_preset_parameter_count_matches_formula(name):
    cfg = get_preset(name)
    assert _count(build_model(cfg)) == cfg.num_parameters()


@pytest.mark.parametrize("kw", [dict(n_kv_heads=2), dict(tie_embeddings=False), dict(n_kv_heads=1, vocab_size=1000)])
def test_gqa_and_untied_counts_match(kw):
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, **kw)
    assert _count(build_model(cfg)) == cfg.num_parameters()


def test_planning_presets_have_published_sizes():
    # Llama-2 7B/13B/70B and Llama-3.2-1B published parameter counts.
    assert PRESETS["7b"].num_parameters() == 6_738_415_616
    assert PRESETS["13b"].num_parameters() == 13_015_864_320
    assert PRESETS["70b"].num_parameters() == 68_976_648_192
    assert PRESETS["1b"].num_parameters() == 1_235_814_400
    assert 0.8e6 < PRESETS["tiny"].num_parameters() < 1.2e6
    assert 20e6 < PRESETS["small"].num_parameters() < 30e6


def test_unknown_preset_and_bad_shapes_are_usage_errors():
    with pytest.raises(UsageError, match="unknown model preset 'nope'; choose one of: tiny"):
        get_preset("nope")
    with pytest.raises(UsageError, match="divisible"):
        ModelConfig(d_model=30, n_layers=1, n_heads=4, d_ff=8)


def test_causal_no_future_leak():
    model = build_model(get_preset("tiny", n_layers=2), seed=0).eval()
    ids = torch.randint(0, 256, (1, 16))
    changed = ids.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 256
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_same_seed_same_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = build_model(get_preset("tiny"), seed=7)
    assert torch.equal(torch.rand(1), expected)
    b = build_model(get_preset("tiny"), seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_sensitive_parts_stay_fp32_in_bf16_true():
    cfg = get_preset("tiny", n_layers=1)
    model = build_model(cfg, seed=0).to(torch.bfloat16)
    ids = torch.randint(0, 256, (2, 8))
    logits = model(ids)
    assert logits.dtype == torch.bfloat16
    assert causal_lm_loss(logits, ids).dtype == torch.float32
    cos, _ = rope_angles(torch.arange(4096), cfg.head_dim, cfg.rope_theta)
    assert cos.dtype == torch.float32
    # fp32 angles at position 4095 differ from bf16-rounded ones: the reason they are never stored in bf16
    exact = torch.tensor(4095.0, dtype=torch.float64).cos().item()
    assert abs(cos[4095, 0].item() - exact) < 1e-3


def test_rmsnorm_statistics_do_not_overflow_in_fp16():
    from ampkit.models.llama import RMSNorm

    norm = RMSNorm(8, 1e-5).half()
    x = torch.full((1, 8), 300.0, dtype=torch.float16)  # 300^2 = 90000 > fp16 max 65504
    out = norm(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), torch.ones(1, 8), rtol=1e-3, atol=1e-3)


def test_flops_per_token_is_6n_plus_attention():
    cfg = get_preset("tiny")
    n = cfg.num_parameters(include_embedding=False) + cfg.vocab_size * cfg.d_model  # tied head still multiplies
    assert training_flops_per_token(cfg, 256) == 6 * n + 12 * cfg.n_layers * cfg.d_model * 256
