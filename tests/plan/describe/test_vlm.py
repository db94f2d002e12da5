"""VLM descriptions (`ampkit.plan.describe.vlm`): exact counts per part on real-size configs of seven
families, equal to transformers' meta-device count; the stacks the ledger reads; configs that leave
shape fields to transformers' defaults refused."""

from __future__ import annotations

import json

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.plan.describe import describe_model
from ampkit.plan.describe.vlm import VLMDescription
from vlm_fixtures import real_size_vlms, write_real_size

transformers = pytest.importorskip("transformers")
REAL = sorted(real_size_vlms())


def meta_count(folder) -> int:
    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        return transformers.AutoModelForImageTextToText.from_config(config).num_parameters()


@pytest.mark.parametrize("name", REAL)
def test_real_size_counts_are_transformers_own_per_part(tmp_path, name):
    folder = write_real_size(tmp_path / name, name)
    desc = describe_model(f"hf:{folder}")
    assert isinstance(desc, VLMDescription) and not desc.analytic
    assert desc.num_parameters() == meta_count(folder)
    assert sum(desc.part_parameters.values()) == desc.num_parameters()
    assert all(n > 0 for n in desc.part_parameters.values())
    m = desc.matmul
    assert 0 < m.vision <= desc.part_parameters["vision"] and m.language > 0
    assert desc.matmul_parameters() <= desc.num_parameters() + (desc.vocab_size * desc.d_model)  # a tied head twice


def test_the_seeds_11b_case(tmp_path):
    desc = describe_model(f"hf:{write_real_size(tmp_path / 'm', 'Llama-3.2-11B-Vision')}")
    assert desc.num_parameters() == 10_670_220_835  # transformers' meta count (DESIGN.md)
    assert desc.fusion is not None and desc.fusion.layers == 8 and desc.language_stack.layers == 32
    assert desc.vision.layers == 40  # 32 local + 8 global encoder layers
    assert desc.family_rule is not None and desc.family_rule.max_tiles == 4


def test_qwen25_windowed_vision_layers_and_gemmas_norms(tmp_path):
    qwen = describe_model(f"hf:{write_real_size(tmp_path / 'q', 'Qwen2.5-VL-7B')}")
    assert (qwen.vision.windowed_layers, qwen.vision.window_tokens) == (28, 64) and qwen.vision.gated
    gemma = describe_model(f"hf:{write_real_size(tmp_path / 'g', 'Gemma-3-4B')}")
    assert gemma.language_stack.norms == 4 and gemma.language_stack.qk_norm
    assert gemma.matmul.projector_image == 1152 * 2560  # a bare projection weight, counted as a matmul


def test_a_config_without_its_shape_fields_is_refused(tmp_path):
    config = dict(real_size_vlms()["LLaVA-1.5-7B"])
    config["text_config"] = {"model_type": "llama"}  # transformers would build a 7B llama of its defaults
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match=r"missing required field\(s\): text_config.hidden_size"):
        describe_model(f"hf:{tmp_path}")
