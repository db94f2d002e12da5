"""Adapters injected through peft: the base frozen in its dtype, the adapters fp32 and seeded, the
trainable count equal to peft's own, the adapted model equal to the base at the start; QLoRA's 4-bit
base where bitsandbytes runs, and the refusal (with the reason and the alternative) where it does not."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.lora import LoraSettings
from ampkit.lora import nf4 as nf4_module
from ampkit.lora.apply import apply_lora, count_parameters, is_adapter, load_peft, peft_config
from ampkit.lora.build import build_lora_model, check_lora_available
from ampkit.lora.nf4 import check_nf4_supported, is_4bit
from ampkit.models import get_preset
from ampkit.models.hf import build_hf_model
from ampkit.models.llama import build_model
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.mlp import TinyMLP
from hf_fixtures import hf_dirs  # noqa: F401  (a fixture)

peft = pytest.importorskip("peft")
IDS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))


def _tiny():
    return build_model(get_preset("tiny", vocab_size=256), seed=0)


def _peft_count(model, settings: LoraSettings, paths: list[str]) -> int:
    """peft's own count: its PeftModel over a fresh copy, get_nb_trainable_parameters()."""
    wrapped = peft.get_peft_model(copy.deepcopy(model), peft_config(settings, paths))
    return wrapped.get_nb_trainable_parameters()[0]


@pytest.mark.parametrize("family", ["tiny", "llama", "mlp"])
def test_trainable_count_equals_peft_own(family, hf_dirs):
    base = {
        "tiny": _tiny,
        "llama": lambda: build_hf_model(f"hf:{hf_dirs['llama']}", seed=0),
        "mlp": lambda: TinyMLP(128, 64, 10),
    }[family]()
    settings = LoraSettings(lora=4)
    model = copy.deepcopy(base)
    info = apply_lora(model, settings, precision="fp32", seed=0)
    assert info.trainable == _peft_count(base, settings, info.targets.paths) > 0
    assert info.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert f"{info.trainable:,} trainable of {info.total:,}" in info.line()


def test_base_frozen_in_its_dtype_adapters_fp32_and_start_equal_to_base():
    base = _tiny().to(torch.bfloat16)
    model = copy.deepcopy(base)
    apply_lora(model, LoraSettings(lora=8), precision="bf16-mixed", seed=0)
    for name, param in model.named_parameters():
        assert param.requires_grad == is_adapter(name)
        assert param.dtype == (torch.float32 if is_adapter(name) else torch.bfloat16), name
    with torch.no_grad():
        assert torch.equal(model(IDS), base(IDS))  # lora_B is zero: the adapted model starts as the base


def test_adapters_are_seeded_whatever_the_base_dtype():
    a, b, c = _tiny(), _tiny().to(torch.bfloat16), _tiny()
    apply_lora(a, LoraSettings(lora=4), precision="fp32", seed=3)
    apply_lora(b, LoraSettings(lora=4), precision="bf16-mixed", seed=3)
    apply_lora(c, LoraSettings(lora=4), precision="fp32", seed=4)
    name = "blocks.0.attn.q_proj.lora_A.default.weight"
    pa, pb, pc = (dict(m.named_parameters())[name] for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert pa.abs().max() <= 1 / 128**0.5 and pa.abs().max() > 0


def test_adapter_dtype_for_experiments():
    model = _tiny().half()
    info = apply_lora(model, LoraSettings(lora=4), precision="fp16-true", seed=0, adapter_dtype=torch.float16)
    assert info.adapter_dtype == "float16"
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float16}


def test_build_lora_model_never_makes_an_fp32_base():
    task = LanguageModelTask(model="tiny", seq_len=32)
    model, info = build_lora_model(
        task, LoraSettings(lora=4), precision="bf16-mixed", device=torch.device("cpu"), seed=0
    )
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16} and info.base_dtype == "bf16"
    full = build_model(get_preset("tiny", vocab_size=task.tokenizer.vocab_size), seed=0)  # a full fine-tune's start
    got = dict(model.named_parameters())["blocks.0.attn.q_proj.base_layer.weight"]
    assert torch.equal(got, full.blocks[0].attn.q_proj.weight.detach().to(torch.bfloat16))


def test_nf4_base_where_bitsandbytes_runs():
    check_nf4_supported(torch.device("cpu"), torch.bfloat16)  # this CPU runs bitsandbytes' 4-bit layers
    base = _tiny().to(torch.bfloat16)
    model = copy.deepcopy(base)
    info = apply_lora(model, LoraSettings(lora=4, base_dtype="nf4"), precision="bf16-mixed", seed=0)
    q = model.blocks[0].attn.q_proj
    assert is_4bit(q.base_layer) and info.base_dtype == "nf4"
    assert info.total == count_parameters(base)[1] + info.trainable  # peft's rule: 2 elements per 4-bit byte
    assert peft.PeftModel.get_nb_trainable_parameters(model) == (info.trainable, info.total)  # peft's own count
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(IDS)
    logits.float().sum().backward()
    assert q.lora_B.default.weight.grad is not None
    with torch.no_grad():
        assert torch.nn.functional.cosine_similarity(logits.float().flatten(), base(IDS).float().flatten(), 0) > 0.99


def test_nf4_refused_where_bitsandbytes_cannot_run(monkeypatch):
    def unsupported(device, dtype):
        raise RuntimeError("no 4-bit kernel for this device")

    monkeypatch.setattr(nf4_module, "_probe", unsupported)
    nf4_module._probe_result.cache_clear()
    try:
        with pytest.raises(UsageError) as err:
            check_lora_available(LoraSettings(lora=8, base_dtype="nf4"), device=torch.device("cpu"), precision="fp32")
    finally:
        nf4_module._probe_result.cache_clear()
    text = str(err.value)
    assert "do not run on cpu" in text and "no 4-bit kernel" in text and "use --base-dtype bf16" in text


def test_missing_peft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(UsageError, match=r"pip install 'ampkit\[lora\]'"):
        load_peft()


def test_meta_models_are_refused():
    with torch.device("meta"):
        model = TinyMLP(8, 8, 2)
    with pytest.raises(RuntimeError, match="materialise the model first"):
        apply_lora(model, LoraSettings(lora=2), precision="fp32", seed=0)


def test_nf4_gradients_flow_through_the_base_after_an_evaluation():
    """bitsandbytes repacks 4-bit weights for inference on AVX512-BF16 CPUs, into a kernel with no
    backward; ampkit keeps the training layout, so after an eval pass the input gradient is still right."""
    linear = torch.nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    model = torch.nn.Sequential(linear)
    apply_lora(model, LoraSettings(lora=2, base_dtype="nf4"), precision="bf16-true", seed=0)
    layer = model[0].base_layer
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    model.eval()
    with torch.no_grad():
        model(x)
    model.train()
    x.requires_grad_(True)
    model(x).float().sum().backward()
    dequantized = nf4_module.dequantize(layer).float()
    assert torch.allclose(x.grad.float(), dequantized.sum(0), rtol=2e-2, atol=2e-2)
