"""A LoRA checkpoint's model state is the adapters alone; the base is named by a checksum that is the
same for the same build and differs for any other base."""

from __future__ import annotations

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.lora import LoraSettings
from ampkit.lora.build import build_lora_model
from ampkit.lora.state import adapter_state_dict, base_checksum, base_identity, load_adapter_state
from ampkit.tasks.lm import LanguageModelTask

pytest.importorskip("peft")
CPU = torch.device("cpu")


def _model(seed: int = 0, **lora):
    task = LanguageModelTask(model="tiny", seq_len=32)
    settings = LoraSettings(lora=4, **lora)
    return build_lora_model(task, settings, precision="bf16-mixed", device=CPU, seed=seed)[0]


def test_adapter_state_holds_the_adapters_only():
    model = _model()
    state = adapter_state_dict(model)
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
    assert sum(v.numel() for v in state.values()) == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_adapters_round_trip_and_mismatches_are_refused():
    a, b = _model(), _model()
    with torch.no_grad():
        a.blocks[0].attn.q_proj.lora_B.default.weight.fill_(0.5)
    load_adapter_state(b, adapter_state_dict(a))
    assert torch.equal(b.blocks[0].attn.q_proj.lora_B.default.weight, a.blocks[0].attn.q_proj.lora_B.default.weight)
    other = _model(lora_targets="q_proj")
    with pytest.raises(UsageError, match="do not match this model"):
        load_adapter_state(other, adapter_state_dict(a))


def test_checksum_names_the_base():
    a, b = base_checksum(_model()), base_checksum(_model())
    assert a == b and a["tensors"] > 0
    assert base_checksum(_model(seed=1))["sha256"] != a["sha256"]
    model = _model()
    with torch.no_grad():
        model.blocks[0].attn.q_proj.lora_B.default.weight.fill_(1.0)  # adapters are not the base
    assert base_checksum(model) == a
    with torch.no_grad():
        model.norm.weight[0] += 1
    assert base_checksum(model)["sha256"] != a["sha256"]


def test_nf4_base_checksum_is_reproducible():
    a, b = _model(base_dtype="nf4"), _model(base_dtype="nf4")
    identity = base_identity(a, model_spec="tiny", base_dtype="nf4")
    assert identity == base_identity(b, model_spec="tiny", base_dtype="nf4")
    assert identity["sha256"] != base_checksum(_model())["sha256"]
