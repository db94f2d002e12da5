"""Tiny configs of the image-text (VLM) families ampkit knows, written here (no downloads).

`tiny_vlm_config(model_type, **overrides)` builds transformers' config of a 2-layer language model
(hidden 32, vocabulary 300: the byte ids, then the image and marker tokens at 290..299) and a
2-layer vision encoder sized for small images; `save_tiny_vlm(path, model_type)` writes it as
`path/config.json` (a folder `hf:path` names). Dropout is 0 (transformers' default for these).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

IMAGE_TOKEN = 299
TEXT = dict(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
MROPE = {"rope_type": "default", "mrope_section": [1, 1, 2]}

TINY_VLMS: dict[str, dict[str, Any]] = {
    "llava": dict(
        text_config=dict(model_type="llama", **TEXT),
        vision_config=dict(model_type="clip_vision_model", **VIT, image_size=32, patch_size=8),
        image_token_index=IMAGE_TOKEN,
    ),
    "mllama": dict(
        text_config={**TEXT, "num_hidden_layers": 4, "cross_attention_layers": [1, 3]},
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_global_layers=1,
            attention_heads=4,
            image_size=32,
            patch_size=8,
            max_num_tiles=2,
            intermediate_layers_indices=[0, 1],
            vision_output_dim=96,
            supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
        ),
        image_token_index=IMAGE_TOKEN,
    ),
    "qwen2_vl": dict(
        text_config={**TEXT, "rope_scaling": MROPE},
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=14),
        image_token_id=IMAGE_TOKEN,
        video_token_id=298,
        vision_start_token_id=297,
        vision_end_token_id=296,
    ),
    "qwen2_5_vl": dict(
        text_config={**TEXT, "rope_scaling": MROPE},
        vision_config=dict(
            depth=2,
            hidden_size=32,
            out_hidden_size=32,
            num_heads=4,
            intermediate_size=64,
            patch_size=14,
            window_size=56,
            fullatt_block_indexes=[1],
        ),
        image_token_id=IMAGE_TOKEN,
        video_token_id=298,
        vision_start_token_id=297,
        vision_end_token_id=296,
    ),
    "idefics3": dict(
        text_config=dict(model_type="llama", **TEXT),
        vision_config=dict(**VIT, image_size=28, patch_size=14),
        scale_factor=2,
        image_token_id=IMAGE_TOKEN,
    ),
    "smolvlm": dict(
        text_config=dict(model_type="llama", **TEXT),
        vision_config=dict(**VIT, image_size=28, patch_size=14),
        scale_factor=2,
        image_token_id=IMAGE_TOKEN,
    ),
    "paligemma": dict(
        text_config=dict(model_type="gemma", **TEXT, head_dim=8),
        vision_config=dict(**VIT, image_size=28, patch_size=14, projection_dim=32),
        image_token_index=IMAGE_TOKEN,
        projection_dim=32,
    ),
    "gemma3": dict(
        text_config=dict(**TEXT, head_dim=8, sliding_window=8),
        vision_config=dict(**VIT, image_size=56, patch_size=14),
        mm_tokens_per_image=4,
        image_token_index=IMAGE_TOKEN,
        boi_token_index=297,
        eoi_token_index=298,
    ),
}


def tiny_vlm_config(model_type: str, **overrides: Any):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**TINY_VLMS[model_type], **overrides})


def save_tiny_vlm(path: Path, model_type: str, **overrides: Any) -> Path:
    tiny_vlm_config(model_type, **overrides).save_pretrained(path)
    return Path(path)


def real_size_vlms() -> dict[str, dict[str, Any]]:
    """benchmarks/hf_configs.py's `VLM_REAL_SIZE`: the published shapes of real VLMs (no downloads)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "hf_configs.py"
    spec = importlib.util.spec_from_file_location("hf_configs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VLM_REAL_SIZE


def write_real_size(folder: Path, name: str) -> Path:
    """`folder/config.json` of the real-size VLM `name` (a key of `real_size_vlms()`)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(real_size_vlms()[name]), encoding="utf-8")
    return folder


SMALL_TEXT = {**TEXT, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 512}
SMALL_VIT = {**VIT, "hidden_size": 96, "intermediate_size": 192}
SMALL_VLMS: dict[str, dict[str, Any]] = {
    "llava": dict(
        text_config=dict(model_type="llama", **SMALL_TEXT),
        vision_config=dict(model_type="clip_vision_model", **SMALL_VIT, image_size=64, patch_size=8),
        image_token_index=511,
    ),
    "gemma3": dict(
        text_config=dict(**SMALL_TEXT, head_dim=32, sliding_window=64),
        vision_config=dict(**SMALL_VIT, image_size=112, patch_size=14),
        mm_tokens_per_image=16,
        image_token_index=511,
        boi_token_index=509,
        eoi_token_index=510,
    ),
    "qwen2_vl": dict(
        text_config=dict(**SMALL_TEXT, rope_scaling={"rope_type": "default", "mrope_section": [4, 6, 6]}),
        vision_config=dict(depth=2, embed_dim=96, hidden_size=128, num_heads=4, mlp_ratio=2, patch_size=14),
        image_token_id=511,
        video_token_id=510,
        vision_start_token_id=509,
        vision_end_token_id=508,
    ),
}
"""VLMs a little larger than the tiny ones (hidden 128, 64 to 112 px images): whose step memory is
measured against the planner's ledger"""
