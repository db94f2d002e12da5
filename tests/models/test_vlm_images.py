"""Each VLM family's image rule (`ampkit.models.vlm_images`) against transformers' slow (PIL) image
processors and processors (the fast ones need torchvision, which does not import beside the pinned
torch), and against the models themselves (a model refuses image inputs whose features do not match
its image tokens)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ampkit.errors import UsageError
from ampkit.models.hf_vlm import build_hf_vlm
from ampkit.models.vlm_images import ImageSize, best_canvas, check_images, image_family, smart_resize
from vlm_fixtures import TINY_VLMS, save_tiny_vlm

transformers = pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL.Image")

SIZES = [(100, 100), (480, 640), (1000, 300), (56, 2000), (3000, 2000), (28, 28), (13, 700), (1080, 1920)]


def image(height: int, width: int):
    pixels = np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return PIL.fromarray(pixels)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen_tokens_are_the_processors_grid_over_the_merge(model_type):
    config = transformers.AutoConfig.for_model(model_type, vision_config={"patch_size": 14, "spatial_merge_size": 2})
    family = image_family(config)
    processor = transformers.Qwen2VLImageProcessorPil()
    for height, width in SIZES:
        out = processor(images=image(height, width), return_tensors="pt")
        t, gh, gw = out["image_grid_thw"][0].tolist()
        cost = family.cost(ImageSize(height, width))
        assert cost.tokens == t * gh * gw // 4, (height, width)  # one token per 28 x 28 pixels
        assert cost.encoder_tokens == out["pixel_values"].shape[0], (height, width)
        assert cost.resized == ImageSize(gh * 14, gw * 14)


def test_qwen_min_and_max_pixels_come_from_the_folders_preprocessor_config(tmp_path):
    config = transformers.AutoConfig.for_model("qwen2_vl")
    (tmp_path / "preprocessor_config.json").write_text('{"min_pixels": 200704, "max_pixels": 401408}')
    family = image_family(config, tmp_path)
    processor = transformers.Qwen2VLImageProcessorPil(min_pixels=200704, max_pixels=401408)
    for height, width in SIZES[:5]:
        t, gh, gw = processor(images=image(height, width), return_tensors="pt")["image_grid_thw"][0].tolist()
        assert family.cost(ImageSize(height, width)).tokens == t * gh * gw // 4


def test_mllama_tiles_are_the_processors_canvas():
    config = transformers.MllamaConfig()
    family = image_family(config)
    processor = transformers.MllamaImageProcessorPil(
        size={"height": family.image_size, "width": family.image_size}, max_image_tiles=family.max_tiles
    )
    ratios = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (3, 1), (4, 1)]
    for height, width in SIZES:
        out = processor(images=[[image(height, width)]], return_tensors="pt")
        cost = family.cost(ImageSize(height, width))
        assert cost.tiles == out["num_tiles"][0][0], (height, width)
        assert ratios[int(out["aspect_ratio_ids"][0, 0]) - 1] == family.tiles_of(ImageSize(height, width))
        patches = (family.image_size // family.patch) ** 2 + 1
        assert (cost.tokens, cost.cross_tokens, cost.encoder_passes) == (1, family.max_tiles * patches, 4)


@pytest.mark.parametrize(
    ("model_type", "processor_class"),
    [("idefics3", "Idefics3ImageProcessorPil"), ("smolvlm", "SmolVLMImageProcessorPil")],
)
def test_idefics3_tiles_are_the_processors_split(model_type, processor_class):
    config = transformers.AutoConfig.for_model(model_type)
    family = image_family(config)
    processor = getattr(transformers, processor_class)(
        max_image_size={"longest_edge": family.tile}, size={"longest_edge": 4 * family.tile}
    )
    for height, width in SIZES:
        out = processor(images=[[image(height, width)]], return_tensors="pt", return_row_col_info=True)
        rows, cols = out["rows"][0][0], out["cols"][0][0]
        assert family.grid(ImageSize(height, width)) == (rows, cols), (height, width)
        cost = family.cost(ImageSize(height, width))
        assert cost.encoder_passes == out["pixel_values"].shape[1]
        assert cost.tokens == cost.encoder_passes * family.tile_tokens


def _tokenizer(special: list[str]):
    """A word-level tokenizer with the processors' special tokens (a processor needs one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["<unk>", "a", "cat"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(special)  # matched anywhere, also run together as the processor expands them
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def test_llava_tokens_are_the_processors_expansion():
    config = transformers.AutoConfig.for_model(
        "llava", vision_config={"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14}
    )
    family = image_family(config)
    tokenizer = _tokenizer(["<image>"])
    side = family.image_size
    pil = transformers.CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    processor = transformers.LlavaProcessor(  # as llava-hf's processor_config.json sets it: CLIP's class token
        image_processor=pil,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    for height, width in SIZES[:4]:
        ids = processor(text="<image> a cat", images=image(height, width), return_tensors="pt")["input_ids"][0]
        assert int((ids == image_id).sum()) == family.cost(ImageSize(side, side)).tokens == 576


@pytest.mark.parametrize("model_type", sorted(TINY_VLMS))
def test_a_model_takes_the_image_tokens_its_rule_gives(tmp_path, model_type):
    """The model's own check: its image features fill exactly the rule's image tokens (transformers
    raises on a mismatch), for every family, with two images a sample."""
    spec = f"hf:{save_tiny_vlm(tmp_path / model_type, model_type)}"
    model = build_hf_vlm(spec, seed=0)
    family = model.family
    size = ImageSize(56, 84) if model_type.startswith("qwen") else family.default_size()
    cost = family.data_cost(size)
    ids = torch.tensor([[*family.wrap(cost.tokens), *family.wrap(cost.tokens), 5, 6, 7]] * 2)
    pixels = torch.rand(2, 2, 3, cost.resized.height, cost.resized.width)
    logits = model(ids, **family.model_inputs(pixels, input_ids=ids))
    assert logits.shape == (2, ids.shape[1], model.config.vocab_size) and torch.isfinite(logits).all()


def test_fixed_towers_refuse_another_size_and_samples_beyond_the_positions():
    config = transformers.AutoConfig.for_model("paligemma")
    family = image_family(config)
    with pytest.raises(UsageError, match="takes 224x224 images only"):
        family.cost(ImageSize(336, 336))
    with pytest.raises(UsageError, match=r"exceed the language model's 1024 positions; at most 3 image"):
        check_images(family, images=5, size=ImageSize(224, 224), text_tokens=10, max_positions=1024)


def test_sizes_parse_and_odd_ones_are_one_line():
    assert ImageSize.parse("336") == ImageSize(336, 336) and ImageSize.parse("448x640") == ImageSize(448, 640)
    for bad in ("big", "0", "3x-1", "1x2x3"):
        with pytest.raises(UsageError, match="--image-size"):
            ImageSize.parse(bad)
    with pytest.raises(UsageError, match="aspect ratios up to 200:1"):
        smart_resize(10, 3000, factor=28, min_pixels=3136, max_pixels=1003520)
    assert best_canvas(560, 1120, max_tiles=4, tile=560) == (1, 2)
