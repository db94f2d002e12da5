"""The locator and doctor on every architecture: a backward fault injected into a decoder layer's MLP
is found (module and phase) on tiny configs of many transformers families, including Falcon, whose
decoder layer adds to its MLP's output in place (`mlp_output += attention_output`), which module
backward hooks break ("Output 0 of BackwardHookFunction is a view and is being modified inplace")."""

from __future__ import annotations

import json

import pytest
import torch

from ampkit.diagnostics import FaultInjector, NonFiniteLocator
from ampkit.diagnostics.grad_hooks import hook_outputs, probe_inputs
from ampkit.models import causal_lm_loss
from ampkit.models.hf import build_hf_model, decoder_layers
from hf_archs import save_tiny

pytest.importorskip("transformers")

ARCHITECTURES = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "phi",
    "phi3",
    "mixtral",
    "qwen3_moe",
    "olmo2",
    "granite",
    "cohere",
    "falcon",
    "gpt_neox",
    "stablelm",
    "starcoder2",
    "bloom",
    "gptj",
    "gpt2",
]


def first_mlp(model) -> str:
    layers = decoder_layers(model.hf)
    names = {id(m): name for name, m in model.named_modules()}
    return f"{names[id(layers[0])]}.mlp"


def step(model, ids):
    model.train()
    causal_lm_loss(model(ids[:, :-1]), ids[:, 1:]).backward()


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_a_backward_fault_in_a_decoder_mlp_is_found(tmp_path, model_type):
    model = build_hf_model(f"hf:{save_tiny(tmp_path, model_type)}", seed=0)
    path = first_mlp(model)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with NonFiniteLocator(model) as locator, FaultInjector(model, f"{path}:backward:inf") as injector:
        step(model, ids)
    assert injector.fired == [1]
    finding = locator.first_nonfinite
    assert finding is not None
    assert (finding.module, finding.phase, finding.site, finding.values) == (path, "backward", "grad_input", "inf")


@pytest.mark.parametrize("model_type", ["falcon", "gpt_neox", "mixtral"])
def test_a_forward_fault_and_a_clean_step(tmp_path, model_type):
    model = build_hf_model(f"hf:{save_tiny(tmp_path, model_type)}", seed=0)
    path = first_mlp(model)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with NonFiniteLocator(model) as locator:
        step(model, ids)
    assert locator.first_nonfinite is None and len(locator.ring) == locator.ring.maxlen
    model.zero_grad(set_to_none=True)
    with FaultInjector(model, f"{path}:forward:nan"), NonFiniteLocator(model) as locator:
        step(model, ids)
    assert (locator.first_nonfinite.module, locator.first_nonfinite.phase) == (path, "forward")


def test_doctor_runs_falcon_and_names_the_faulty_mlp(tmp_path, run_cli):
    spec = f"hf:{save_tiny(tmp_path / 'falcon', 'falcon')}"
    model = build_hf_model(spec, seed=0)
    path = first_mlp(model)
    code, stdout, err = run_cli(
        *("doctor", "--model", spec, "--precision", "fp32", "--steps", "2", "--seq-len", "16"),
        *("--batch-size", "2", "--no-smoke", "--no-fidelity", "--inject", f"{path}:backward:inf@1"),
        *("--out", str(tmp_path / "doctor"), "--json"),
    )
    assert code == 0, err
    finding = json.loads(stdout)["locator"]["first_nonfinite"]
    assert (finding["module"], finding["phase"], finding["step"]) == (path, "backward", 1)


def test_probes_see_their_own_module_gradient_and_in_place_outputs_are_fine():
    x = torch.randn(3, requires_grad=True)
    seen: list = []
    (probed,) = probe_inputs((x,), lambda grads: seen.append(("input", grads[0].clone())))
    out = probed * 2  # the "module"
    assert hook_outputs(out, lambda g: seen.append(("output", g.clone()))) == 1
    out += 1  # in place on the module's output, as Falcon does: fine with tensor hooks
    (out.sum() + 5 * x.sum()).backward()  # x also used elsewhere: the probe sees only the module's share
    assert [kind for kind, _ in seen] == ["output", "input"]
    torch.testing.assert_close(seen[1][1], torch.full((3,), 2.0))
    torch.testing.assert_close(x.grad, torch.full((3,), 7.0))
    assert probe_inputs((torch.zeros(2),), lambda g: None) is None  # nothing needs a gradient
