"""The meta-device build of `hf:` models: transformers' own init, every random draw seeded per tensor
name (`ampkit.models.hf_init`), for causal LMs of many architectures and for VLMs."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from ampkit.models.hf import build_hf_model
from ampkit.models.hf_init import init_hf_weights
from ampkit.models.init import materialize
from ampkit.precision import build_precision
from hf_archs import TINY, save_tiny, tiny_config
from vlm_fixtures import TINY_VLMS, tiny_vlm_config

transformers = pytest.importorskip("transformers")


def built_on_meta(auto, config, *, seed: int, dtype=torch.float32) -> nn.Module:
    with torch.device("meta"):
        model = auto.from_config(config, dtype=dtype)
    model.to_empty(device="cpu")
    init_hf_weights(model, seed=seed)
    return model


CONFIGS = [(transformers.AutoModelForCausalLM, tiny_config, t) for t in TINY] + [
    (transformers.AutoModelForImageTextToText, tiny_vlm_config, t) for t in TINY_VLMS
]


@pytest.mark.parametrize(("auto", "make", "model_type"), CONFIGS, ids=[c[2] for c in CONFIGS])
def test_buffers_are_transformers_own_and_weights_its_distributions(auto, make, model_type):
    """Rotary frequencies, position ids and scales equal a model transformers initialised itself; each
    weight has the spread transformers gives it (zero gates and biases stay zero, norms stay one)."""
    model = built_on_meta(auto, make(model_type), seed=3)
    torch.manual_seed(0)
    reference = auto.from_config(make(model_type))
    want = dict(reference.named_buffers())
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, want[name]), name
    params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        p = p.detach()
        assert torch.isfinite(p).all(), name
        ref = params[name].detach()
        if ref.numel() > 1 and float(ref.std()) == 0.0:  # a constant (zeros, ones, a fixed scale)
            assert torch.equal(p, ref), name
        elif p.numel() >= 64:
            assert float(p.std()) == pytest.approx(float(ref.std()), rel=0.5), name
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    ref_tied = reference.get_output_embeddings().weight is reference.get_input_embeddings().weight
    assert (head.weight is embed.weight) == ref_tied  # to_empty untied them; tied again as transformers does


def test_the_init_depends_on_the_seed_alone_in_every_dtype():
    config = tiny_vlm_config("llava")
    auto = transformers.AutoModelForImageTextToText
    before = torch.get_rng_state()
    a, b, c = (built_on_meta(auto, config, seed=s) for s in (5, 5, 6))
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is not advanced
    half = built_on_meta(auto, config, seed=5, dtype=torch.bfloat16)
    for (name, pa), pb, pc, ph in zip(a.named_parameters(), b.parameters(), c.parameters(), half.parameters()):
        assert torch.equal(pa, pb), name
        assert torch.equal(ph, pa.to(torch.bfloat16)), name  # bf16: the fp32 draw, rounded once
        if float(pa.std()) > 0:
            assert not torch.equal(pa, pc), name


def test_hf_causal_lm_builds_on_meta_and_materialises_to_the_same_weights(tmp_path):
    folder = save_tiny(tmp_path / "llama", "llama")
    direct = build_hf_model(f"hf:{folder}", seed=9)
    late = build_hf_model(f"hf:{folder}", device="meta", seed=9)
    assert all(p.is_meta for p in late.parameters())
    materialize(late, device="cpu", seed=9)
    for (name, p), q in zip(direct.named_parameters(), late.parameters()):
        assert torch.equal(p, q), name
    with build_precision("bf16-true", device_type="cpu").init_context():
        bf16 = build_hf_model(f"hf:{folder}", seed=9)
    for (name, p), q in zip(direct.named_parameters(), bf16.parameters()):
        assert torch.equal(p.to(torch.bfloat16), q), name


class ScaledConfig(transformers.PretrainedConfig):
    model_type = "ampkit-test-scaled"

    def __init__(self, width: int = 8, **kwargs):
        self.width = width
        super().__init__(**kwargs)


class Scaled(transformers.PreTrainedModel):
    """A model with a raw parameter its `_init_weights` does not know (as custom architectures have)."""

    config_class = ScaledConfig

    def __init__(self, config):
        super().__init__(config)
        self.proj = nn.Linear(config.width, config.width)
        self.scale = nn.Parameter(torch.empty(config.width))
        self.post_init()


def test_a_parameter_the_init_leaves_alone_is_drawn_and_named(caplog):
    with torch.device("meta"):
        model = Scaled(ScaledConfig())
    model.to_empty(device="cpu")
    with caplog.at_level(logging.WARNING, logger="ampkit.models.hf_init"):
        init_hf_weights(model, seed=1)
    assert torch.isfinite(model.scale).all() and float(model.scale.std()) > 0
    assert "scale" in caplog.text and "left 1 parameter" in caplog.text
