"""Smoke test (overfit 16 samples) and per-layer fidelity."""

from __future__ import annotations

import pytest
import torch

from ampkit.diagnostics import FaultInjector, insert_unsafe_op
from ampkit.diagnostics.layer_fidelity import compare_layers
from ampkit.diagnostics.smoke import SmokeConfig, run_smoke_test
from ampkit.models import build_model, get_preset
from ampkit.precision import build_precision
from ampkit.tasks.lm import smoke_batch


@pytest.fixture(scope="module")
def batch():
    return smoke_batch(samples=16, seq_len=32, seed=0)


def _model():
    return build_model(get_preset("tiny"), seed=0)


def test_smoke_batch_is_memorizable(batch):
    rows = [tuple(r) for r in batch.input_ids.tolist()]
    assert len(rows) == 16 and len(set(rows)) == 16
    assert batch.n_tokens == 16 * 32  # full rows, no padding
    seen = {}
    for inputs, targets in zip(batch.input_ids.tolist(), batch.targets.tolist()):
        for t in range(32):
            prefix = tuple(inputs[: t + 1])
            assert seen.setdefault(prefix, targets[t]) == targets[t]  # no prefix continues two ways
        assert inputs[0] != inputs[1]


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_smoke_passes(precision):
    # 8 sequences of 16 tokens: memorized in ~40 steps (16 x 32, doctor's default: ~90, 8x the work; bf16
    # matmuls are emulated, and slow, on a CPU without AVX512-BF16/AMX)
    batch = smoke_batch(samples=8, seq_len=16, seed=0)
    policy = build_precision(precision, device_type="cpu")
    result = run_smoke_test(policy.convert_module(_model()), policy, batch, config=SmokeConfig(max_steps=200))
    assert result.passed, result.diagnosis
    assert result.accuracy[-1] == 1.0 and max(result.accuracy[:-1]) < 1.0
    assert result.steps_needed == len(result.accuracy) - 1 < 200
    assert f"after {result.steps_needed} steps" in result.diagnosis


@pytest.mark.parametrize(
    ("spec", "failure", "phase"),
    [
        ("blocks.2.attn.attn:forward:nan@4", "nonfinite_loss", "forward"),
        ("blocks.0.mlp.down_proj:backward:inf@3", "nonfinite_grad", "backward"),
    ],
)
def test_smoke_fails_with_a_diagnosis_when_a_fault_is_injected(batch, spec, failure, phase):
    policy = build_precision("fp32", device_type="cpu")
    model = _model()
    with FaultInjector(model, spec) as injector:
        result = run_smoke_test(model, policy, batch, observers=[injector])
    module = spec.split(":")[0]
    assert not result.passed and result.failure == failure
    assert result.failure_step == int(spec.rsplit("@", 1)[1])
    assert (result.finding.module, result.finding.phase) == (module, phase)
    assert module in result.diagnosis and "FAILED" in result.diagnosis
    assert all(torch.isfinite(p).all() for p in model.parameters())  # stopped before the bad update


def test_smoke_fails_on_fp16_unsafe_op_and_names_it(batch):
    policy = build_precision("fp16-mixed", device_type="cpu")
    torch.manual_seed(0)
    model = insert_unsafe_op(_model(), "blocks.1.mlp")
    result = run_smoke_test(model, policy, batch, config=SmokeConfig(max_steps=5))
    assert result.failure == "nonfinite_loss" and result.failure_step == 1
    assert (result.finding.module, result.finding.cls) == ("blocks.1.mlp", "NaiveExpGate")


def test_layer_fidelity(batch):
    model = _model()
    clean = compare_layers(model, batch, precision="bf16-mixed", device_type="cpu")
    names = [layer.name for layer in clean.layers]
    assert names == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "logits"]
    assert clean.first_below is None and clean.verdict == "good"
    assert all(0.99 <= layer.cosine <= 1.0 + 1e-9 for layer in clean.layers)
    assert 0 < clean.layers[-1].rel_error < 0.1  # bf16 is not bit-exact, but close
    assert model.training  # left as it was
    torch.manual_seed(0)
    unsafe = insert_unsafe_op(_model(), "blocks.2.mlp")
    broken = compare_layers(unsafe, batch, precision="fp16-mixed", device_type="cpu")
    assert broken.first_below == "blocks.2" and broken.verdict == "bad"
    strict = compare_layers(model, batch, precision="bf16-true", device_type="cpu", threshold=1.0)
    assert strict.first_below == "embed"  # a threshold nothing meets: bf16 weights already round the embedding
