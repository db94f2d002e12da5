"""`hf:` image-text models (VLMs): built on the meta device and materialised with the seeded init,
their parts (every parameter in exactly one), frozen parts, repeated layers; configs of neither kind
refused in one line."""

from __future__ import annotations

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.models.hf import CAUSAL_LM, IMAGE_TEXT, build_hf_model, check_kind, load_hf_config, model_kind
from ampkit.models.hf_vlm import PARTS, build_hf_vlm, describe_hf_vlm, find_parts, freeze, is_image_text
from ampkit.models.init import materialize
from hf_archs import save_tiny
from vlm_fixtures import TINY_VLMS, save_tiny_vlm

transformers = pytest.importorskip("transformers")
PART_ROOTS = {  # transformers' own module names for each family's parts
    "llava": ("model.vision_tower", "model.multi_modal_projector", "model.language_model"),
    "mllama": ("model.vision_model", "model.multi_modal_projector", "model.language_model"),
    "qwen2_vl": ("model.visual", "model.visual.merger", "model.language_model"),
    "qwen2_5_vl": ("model.visual", "model.visual.merger", "model.language_model"),
    "idefics3": ("model.vision_model", "model.connector", "model.text_model"),
    "smolvlm": ("model.vision_model", "model.connector", "model.text_model"),
    "paligemma": ("model.vision_tower", "model.multi_modal_projector", "model.language_model"),
    "gemma3": ("model.vision_tower", "model.multi_modal_projector", "model.language_model"),
}


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    return {t: save_tiny_vlm(root / t, t) for t in TINY_VLMS}


@pytest.mark.parametrize("model_type", sorted(TINY_VLMS))
def test_parts_hold_every_parameter_once_and_count_like_transformers(vlm_dirs, model_type):
    spec = f"hf:{vlm_dirs[model_type]}"
    info = describe_hf_vlm(spec)
    config = transformers.AutoConfig.from_pretrained(vlm_dirs[model_type])
    with torch.device("meta"):
        reference = transformers.AutoModelForImageTextToText.from_config(config)
    assert info.num_parameters() == reference.num_parameters()
    assert set(info.part_parameters) == set(PARTS) and sum(info.part_parameters.values()) == info.total_parameters
    parts = find_parts(reference)
    vision, projector, language = PART_ROOTS[model_type]
    assert vision in parts.roots["vision"] and projector in parts.roots["projector"]
    assert language in parts.roots["language"] and "lm_head" in parts.roots["language"]
    assert info.convolutions >= 1  # every tower's patch embedding is a convolution


def test_mllamas_cross_attention_layers_are_fusion_in_the_projector(vlm_dirs):
    model = build_hf_vlm(f"hf:{vlm_dirs['mllama']}", device="meta")
    parts = model.parts
    fusion = {n for n, p in parts.of_parameter.items() if p == "projector" and ".layers." in n}
    assert fusion and all(
        n.startswith(("model.language_model.layers.1.", "model.language_model.layers.3.")) for n in fusion
    )


def test_meta_build_materialises_to_the_seeded_init_and_frozen_parts_stay_frozen(vlm_dirs):
    spec = f"hf:{vlm_dirs['llava']}"
    direct = build_hf_vlm(spec, seed=4, frozen=("vision",))
    late = build_hf_vlm(spec, device="meta", seed=4, frozen=("vision",))
    assert all(p.is_meta for p in late.parameters())
    materialize(late, device="cpu", seed=4)
    for (name, p), q in zip(direct.named_parameters(), late.parameters()):
        assert torch.equal(p, q), name
        assert p.requires_grad == q.requires_grad == (not name.startswith("hf.model.vision_tower")), name
    assert sum(p.numel() for p in direct.parameters() if not p.requires_grad) == direct.config.part_parameters["vision"]
    layers = {type(b).__name__ for b in direct.blocks}
    assert layers == {"CLIPEncoderLayer", "LlamaDecoderLayer"} and len(direct.blocks) == 4


def test_weights_in_the_folder_are_loaded(tmp_path, vlm_dirs):
    trained = build_hf_vlm(f"hf:{vlm_dirs['paligemma']}", seed=2)
    trained.hf.save_pretrained(tmp_path / "ckpt")
    loaded = build_hf_vlm(f"hf:{tmp_path / 'ckpt'}", seed=0)
    assert loaded.config.pretrained
    for (name, p), q in zip(loaded.hf.named_parameters(), trained.hf.parameters()):
        assert torch.equal(p, q), name


def test_the_kinds_are_told_apart_and_any_other_is_one_line(tmp_path, vlm_dirs):
    llama = save_tiny(tmp_path / "llama", "llama")
    assert model_kind(load_hf_config(f"hf:{llama}")) == CAUSAL_LM and not is_image_text(f"hf:{llama}")
    assert model_kind(load_hf_config(f"hf:{vlm_dirs['gemma3']}")) == IMAGE_TEXT
    assert is_image_text(f"hf:{vlm_dirs['mllama']}")
    transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4).save_pretrained(tmp_path / "vit")
    with pytest.raises(UsageError, match="'vit' is neither a causal LM .* nor an image-text model"):
        check_kind(load_hf_config(f"hf:{tmp_path / 'vit'}"), tmp_path / "vit" / "config.json")
    with pytest.raises(UsageError, match="not a causal LM; build it with build_hf_vlm"):
        build_hf_model(f"hf:{vlm_dirs['llava']}")


def test_a_part_name_that_matches_nothing_is_one_line(vlm_dirs):
    model = build_hf_vlm(f"hf:{vlm_dirs['llava']}", device="meta")
    with pytest.raises(UsageError, match="'encoder': not a part name; choose from vision, projector, language"):
        freeze(model, ["encoder"])
