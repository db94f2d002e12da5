"""Acceptance: a matrix of injected faults over the built-in model; the locator names the exact
module and phase every time."""

from __future__ import annotations

import pytest
import torch

from ampkit.diagnostics import FaultInjector, NonFiniteLocator, insert_unsafe_op
from ampkit.models import build_model, causal_lm_loss, get_preset

CUSTOM = "blocks.1.mlp"  # NaiveExpGate, the deliberately fp16-unsafe custom op

# (module path, phase, kind): every kind of module of the tiny model, both phases.
MATRIX = [
    ("embed", "forward", "inf"),
    ("blocks.0.attn_norm", "forward", "nan"),
    ("blocks.0.attn.q_proj", "forward", "inf"),
    ("blocks.0.attn.k_proj", "forward", "nan"),
    ("blocks.1.attn.v_proj", "forward", "overflow"),
    ("blocks.0.attn.attn", "forward", "nan"),
    ("blocks.2.attn.o_proj", "forward", "inf"),
    ("blocks.0.mlp_norm", "forward", "inf"),
    ("blocks.0.mlp.gate_proj", "forward", "nan"),
    ("blocks.3.mlp.up_proj", "forward", "inf"),
    ("blocks.2.mlp.down_proj", "forward", "overflow"),
    ("blocks.3", "forward", "nan"),
    ("norm", "forward", "nan"),
    ("lm_head", "forward", "inf"),
    (CUSTOM, "forward", "nan"),
    (CUSTOM + ".score", "forward", "inf"),
    ("embed", "backward", "nan"),
    ("blocks.0.attn_norm", "backward", "inf"),
    ("blocks.1.attn.q_proj", "backward", "nan"),
    ("blocks.2.attn.k_proj", "backward", "inf"),
    ("blocks.0.attn.v_proj", "backward", "nan"),
    ("blocks.3.attn.attn", "backward", "inf"),
    ("blocks.1.attn.o_proj", "backward", "overflow"),
    ("blocks.2.mlp_norm", "backward", "nan"),
    ("blocks.0.mlp.gate_proj", "backward", "inf"),
    ("blocks.2.mlp.up_proj", "backward", "nan"),
    ("blocks.3.mlp.down_proj", "backward", "inf"),
    ("norm", "backward", "inf"),
    ("lm_head", "backward", "nan"),
    (CUSTOM, "backward", "inf"),
    (CUSTOM + ".score", "backward", "overflow"),
]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return insert_unsafe_op(build_model(get_preset("tiny"), seed=0), CUSTOM, gain=1.0)  # gain 1: finite in fp16 too


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))


def _one_step(model, tokens, spec: str, *, autocast_dtype=None):
    model.zero_grad(set_to_none=True)
    with FaultInjector(model, spec) as injector, NonFiniteLocator(model) as locator:
        with torch.autocast("cpu", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
    model.zero_grad(set_to_none=True)
    assert injector.fired == [1], f"{spec} did not fire"
    return locator


def test_matrix_covers_the_acceptance_set():
    modules = {m for m, _, _ in MATRIX}
    assert len(MATRIX) >= 20
    assert {p for _, p, _ in MATRIX} == {"forward", "backward"}
    for needed in (
        "embed",
        "blocks.0.attn.q_proj",
        "blocks.0.attn.attn",
        "blocks.0.mlp.gate_proj",
        "blocks.0.attn_norm",
        "lm_head",
        CUSTOM,
    ):
        assert needed in modules


@pytest.mark.parametrize(("path", "phase", "kind"), MATRIX, ids=[":".join(c) for c in MATRIX])
def test_locator_names_the_injected_module_and_phase(model, tokens, path, phase, kind):
    locator = _one_step(model, tokens, f"{path}:{phase}:{kind}")
    # In fp32 an "overflow" fault is finite but past fp16's max: it is the first near-limit value.
    finding = locator.first_near_max if kind == "overflow" else locator.first_nonfinite
    assert finding is not None, f"nothing found for {path}:{phase}:{kind}"
    assert (finding.module, finding.phase) == (path, phase)
    assert finding.cls == type(dict(model.named_modules())[path]).__name__
    if kind == "overflow":
        assert locator.first_nonfinite is None
    else:
        assert kind in finding.values
        expected_site = "outputs" if phase == "forward" else ("param_grad" if path == "embed" else "grad_input")
        assert finding.site == expected_site
        assert finding.frames and finding.frames[-1].module == path  # the ring ends at the culprit


@pytest.mark.parametrize(
    ("path", "phase"),
    [("blocks.0.attn.q_proj", "forward"), ("blocks.2.mlp.up_proj", "forward"), ("blocks.1.attn.o_proj", "backward")],
)
def test_overflow_fault_is_inf_under_fp16_autocast(model, tokens, path, phase):
    locator = _one_step(model, tokens, f"{path}:{phase}:overflow", autocast_dtype=torch.float16)
    finding = locator.first_nonfinite
    assert finding is not None and (finding.module, finding.phase) == (path, phase)
    assert "inf" in finding.values


def test_clean_step_finds_nothing(model, tokens):
    model.zero_grad(set_to_none=True)
    with NonFiniteLocator(model) as locator:
        causal_lm_loss(model(tokens), tokens).backward()
    model.zero_grad(set_to_none=True)
    assert locator.first_nonfinite is None and locator.first_near_max is None
    assert len(locator.ring) == locator.ring.maxlen  # it did record (a full ring of frames)
