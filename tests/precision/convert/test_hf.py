"""Every low-bit format's converter on every transformers architecture the HF tests build (tests/hf_archs.py):
one training step (forward with labels, backward) of the tiny model converted, or a one-line refusal when it
has no Linear the format's shape rule admits (GPT-2's blocks are Conv1D: only its head is an nn.Linear).

The case that found it: Falcon's decoder adds the attention output into the MLP's in place
(`mlp_output += attention_output`), and torchao's training matmuls return a view made inside their
autograd Function, which autograd forbids modifying in place; the converters guard those outputs."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from ampkit.precision import SPECS, ConversionRefused, build_precision
from ampkit.precision.convert.base import LinearConverter
from hf_archs import TINY, tiny_config

pytest.importorskip("transformers")
pytest.importorskip("torchao")

EMULATED = sorted(name for name, spec in SPECS.items() if spec.converts_linears and spec.emulated)
NO_LINEAR_BUT_THE_HEAD = {"gpt2"}  # GPT-2's attention and MLP are transformers' Conv1D


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # tiny shapes: no fork/join per op (conftest restores the count)


@functools.cache
def _tiny(arch: str):
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng():  # seeded weights, and the suite's global generator left as it was
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(tiny_config(arch), attn_implementation="eager")


def _step(arch: str, precision: str) -> tuple[float, int]:
    """One forward (with labels) and backward of `arch`'s tiny model under `precision`: (loss, converted)."""
    model = copy.deepcopy(_tiny(arch))
    policy = build_precision(precision, device_type="cpu")
    policy.convert_module(model)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with policy.forward_context():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    report = policy.conversion()
    assert report is not None
    return loss.item(), len(report.converted)


@pytest.mark.parametrize("precision", EMULATED)
@pytest.mark.parametrize("arch", sorted(TINY))
def test_every_format_trains_every_architecture_or_refuses_it_in_one_line(arch, precision):
    if arch in NO_LINEAR_BUT_THE_HEAD:
        with pytest.raises(ConversionRefused, match="its only nn.Linear layer is the output head") as no:
            _step(arch, precision)
        assert "\n" not in str(no.value)
        return
    loss, converted = _step(arch, precision)
    assert converted > 0 and torch.isfinite(torch.tensor(loss))


@pytest.mark.parametrize("precision", ["fp8-emulated", "mxfp8-emulated"])
def test_without_the_output_guard_falcons_in_place_add_breaks_torchaos_matmuls(monkeypatch, precision):
    monkeypatch.setattr(LinearConverter, "guards_outputs", lambda self: False)
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        _step("falcon", precision)
