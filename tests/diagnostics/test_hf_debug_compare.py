"""ampkit's non-finite locator against transformers' `DebugUnderflowOverflow` on the same tiny HF Llama
(same seed, same batch, same injected fault):
- a forward fault: both tools name the same module (ampkit's path is transformers' prefixed `hf.`),
  through the Python API and through `ampkit doctor --model hf:PATH --inject ...`;
- a backward-only fault: transformers' tool, made of forward hooks, sees nothing; ampkit names the
  module and the phase.
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
import torch

from ampkit.diagnostics import FaultInjector, NonFiniteLocator
from ampkit.models import causal_lm_loss
from ampkit.models.hf import build_hf_model
from hf_fixtures import make_tiny_llama

debug_utils = pytest.importorskip("transformers.debug_utils")  # the optional `ampkit[hf]` extra
# The locator hooks every module's backward; torch warns that it cannot for modules returning a
# transformers ModelOutput (the model roots). Their children's hooks cover the same values.
pytestmark = pytest.mark.filterwarnings("ignore:For backward hooks to be called:UserWarning")

# DebugUnderflowOverflow prints one header per frame, "<17 spaces> <module path> <class>"; value lines
# start with numbers (or a right-aligned "None"), so 18 leading spaces mark a header unambiguously.
_FRAME_HEADER = re.compile(r"^ {18}(\S+) (\S+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def llama_spec(tmp_path_factory) -> str:
    return f"hf:{make_tiny_llama(tmp_path_factory.mktemp('hf') / 'tiny-llama')}"


def training_step(model, ids: torch.Tensor) -> None:
    model.train()
    causal_lm_loss(model(ids[:, :-1]), ids[:, 1:]).backward()


def hf_debug_run(model, ids: torch.Tensor) -> tuple[str | None, str]:
    """One training step under DebugUnderflowOverflow: (module it blames or None, what it printed).
    The tool hooks the transformers model itself, so its paths are transformers' own."""
    debug_utils.DebugUnderflowOverflow(model.hf, max_frames_to_save=5)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            training_step(model, ids)
        except ValueError as err:  # the tool stops the run at the first inf/nan
            assert "inf/nan detected" in str(err)
    text = printed.getvalue()
    if "Detected inf/nan" not in text:
        return None, text
    return _FRAME_HEADER.findall(text)[-1][0], text  # the dump ends with the frame that held it


def ampkit_run(model, ids: torch.Tensor, fault: str):
    with NonFiniteLocator(model) as locator, FaultInjector(model, fault) as injector:
        training_step(model, ids)
    assert injector.fired == [1]
    return locator.first_nonfinite


def test_forward_fault_both_tools_name_the_same_module(llama_spec):
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    model = build_hf_model(llama_spec, seed=0)
    fault = "hf.model.layers.0.mlp.down_proj:forward:nan"
    finding = ampkit_run(model, ids, fault)
    model.zero_grad(set_to_none=True)
    with FaultInjector(model, fault):  # the same model, fault and batch, now under transformers' tool
        blamed, printed = hf_debug_run(model, ids)
    assert blamed == "model.layers.0.mlp.down_proj", printed
    assert (finding.module, finding.phase, finding.site) == ("hf." + blamed, "forward", "outputs")
    assert finding.values == "nan"


def test_ampkit_doctor_names_the_module_the_hf_tool_names(llama_spec, tmp_path, run_cli):
    fault = "hf.model.layers.0.mlp.down_proj:forward:nan"
    model = build_hf_model(llama_spec, seed=0)
    with FaultInjector(model, fault):
        blamed, printed = hf_debug_run(model, torch.randint(0, 256, (2, 12)))
    code, stdout, err = run_cli(
        "doctor",
        "--model",
        llama_spec,
        "--precision",
        "fp32",
        "--steps",
        "2",
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--no-smoke",
        "--no-fidelity",
        "--inject",
        f"{fault}@1",
        "--out",
        str(tmp_path / "doctor"),
        "--json",
    )
    assert code == 0, err
    finding = json.loads(stdout)["locator"]["first_nonfinite"]
    assert blamed is not None and finding["module"] == "hf." + blamed, printed
    assert (finding["phase"], finding["step"]) == ("forward", 1)


def test_backward_only_fault_is_invisible_to_the_hf_tool(llama_spec):
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    model = build_hf_model(llama_spec, seed=0)
    fault = "hf.model.layers.1.self_attn.o_proj:backward:inf"
    with FaultInjector(model, fault) as injector:
        blamed, printed = hf_debug_run(model, ids)
    assert injector.fired == [1]  # the fault did fire ...
    assert not all(torch.isfinite(p.grad).all() for p in model.parameters())  # ... and poisoned the gradients
    assert blamed is None and "Detected inf/nan" not in printed  # ... yet the forward-only tool saw nothing

    fresh = build_hf_model(llama_spec, seed=0)  # DebugUnderflowOverflow's hooks cannot be removed
    finding = ampkit_run(fresh, ids, fault)
    assert (finding.module, finding.phase, finding.site) == (
        "hf.model.layers.1.self_attn.o_proj",
        "backward",
        "grad_input",
    )
    assert finding.values == "inf"
