"""Contract tests over every precision: what the policy promises, whatever the regime."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from ampkit.models import build_model, causal_lm_loss, get_preset
from ampkit.precision import SPECS, build_precision, check_supported
from helpers import cpu_runs_fp8_matmuls

ALL = sorted(SPECS)
CFG = get_preset("tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64)


def _policy(name):
    return build_precision(name, device_type="cpu")


def _sm100_only(name: str) -> bool:
    """Native MXFP8/NVFP4 Linears run torchao's CUDA/Triton kernels (sm100), not even on fake CPU
    tensors; native MXFP4 has none anywhere. Their CPU path is the `-emulated` twin, which ALL holds."""
    spec = SPECS[name]
    return spec.native_low_bit and spec.matmul_key != "fp8"


RUNS_HERE = [name for name in ALL if not _sm100_only(name)]


def test_the_sm100_only_precisions_are_refused_on_a_cpu_naming_their_emulated_twin():
    from ampkit.errors import UsageError
    from ampkit.hardware import describe_device

    names = [name for name in ALL if _sm100_only(name)]
    assert {"mxfp8", "nvfp4", "mxfp4"} <= set(names)
    for name in names:
        with pytest.raises(UsageError, match=str(SPECS[name].emulated_twin)):
            check_supported(name, describe_device(torch.device("cpu")))


@pytest.mark.parametrize("name", RUNS_HERE)
def test_dtypes_inside_forward_context(name):
    """The dtypes each policy's forward produces; native fp8 on a CPU whose oneDNN has no float8 matmul
    runs on fake tensors (the same dtypes from the ops' shape functions, no values)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec, policy = SPECS[name], _policy(name)
    model = policy.convert_module(build_model(CFG, seed=0))
    assert {p.dtype for p in model.parameters()} == {spec.param_dtype}
    ids = torch.randint(0, 256, (2, 8))
    values = not spec.native_low_bit or cpu_runs_fp8_matmuls()
    mode = contextlib.nullcontext() if values else FakeTensorMode(allow_non_fake_inputs=True)
    with mode, policy.run_context(), policy.forward_context():
        hidden = model.embed(ids)
        matmul_out = model.blocks[0].attn.q_proj(hidden)
        loss = causal_lm_loss(model(ids), ids)
    assert matmul_out.dtype == spec.compute_dtype
    assert loss.dtype == torch.float32


@pytest.mark.parametrize("name", ALL)
def test_the_converted_inputs_are_what_the_converted_weights_take(name):
    # Lightning's convert_input: whatever casts the weights casts the inputs, so float inputs reach a
    # -true regime's Linear in its dtype; class labels and token ids are never cast.
    spec, policy = SPECS[name], _policy(name)
    with policy.init_context():
        model = nn.Linear(4, 3)
    features, labels = torch.randn(2, 4), torch.tensor([0, 2])
    converted, kept = policy.convert_input((features, labels))
    assert converted.dtype == spec.param_dtype == model.weight.dtype and kept is labels
    with policy.run_context(), policy.forward_context():
        out = model(converted)  # fp32 input beside bf16 weights would raise: "mat1 and mat2 must have the same dtype"
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ALL)
def test_state_restored_even_when_body_raises(name):
    policy = _policy(name)
    before = (
        torch.is_autocast_enabled("cpu"),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_default_dtype(),
    )
    with pytest.raises(RuntimeError, match="boom"), policy.run_context():
        assert torch.backends.cuda.matmul.allow_tf32 == SPECS[name].tf32
        assert torch.backends.cudnn.allow_tf32 == SPECS[name].tf32
        with policy.forward_context():
            assert torch.is_autocast_enabled("cpu") == SPECS[name].autocast
            raise RuntimeError("boom")
    after = (
        torch.is_autocast_enabled("cpu"),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_default_dtype(),
    )
    assert after == before


@pytest.mark.parametrize("name", RUNS_HERE)
def test_state_dict_round_trip(name):
    if SPECS[name].native_low_bit and not cpu_runs_fp8_matmuls():
        pytest.skip(f"this CPU's oneDNN has no float8 matmul: {name}'s round trip runs as its emulated twin's")
    policy = _policy(name)
    model = policy.convert_module(nn.Sequential(nn.Linear(32, 32)))  # 32: whole blocks for every format
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        with policy.forward_context():
            loss = model(torch.randn(2, 32, dtype=SPECS[name].param_dtype)).float().pow(2).mean()
        policy.backward(loss)
        policy.unscale_gradients(opt)
        policy.optimizer_step(opt)
        opt.zero_grad()
    restored = _policy(name)
    restored.load_state_dict(policy.state_dict())
    assert restored.state_dict() == policy.state_dict()
    assert restored.loss_scale() == policy.loss_scale()
    assert (policy.loss_scale() is not None) == SPECS[name].loss_scaling


def _fp16_step(policy, model, opt, *, poison: bool) -> bool:
    with policy.forward_context():
        loss = model(torch.randn(2, 4)).float().pow(2).mean()
    if poison:
        loss = loss * float("inf")
    policy.backward(loss)
    policy.unscale_gradients(opt)
    stepped = policy.optimizer_step(opt)
    opt.zero_grad()
    return stepped


def test_overflow_skips_step_backs_off_and_the_scale_survives_a_round_trip():
    policy = build_precision("fp16-mixed", device_type="cpu")
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    assert _fp16_step(policy, model, opt, poison=True) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the step was skipped
    assert policy.loss_scale() == 32768.0
    assert _fp16_step(policy, model, opt, poison=False) is True
    restored = build_precision("fp16-mixed", device_type="cpu")
    restored.load_state_dict(policy.state_dict())
    assert restored.loss_scale() == 32768.0
    assert restored.scaler.state_dict() == policy.scaler.state_dict()


def test_scale_collapse_below_floor_is_an_error():
    from ampkit.precision import LossScaleCollapse, ScalerConfig

    policy = build_precision("fp16-mixed", device_type="cpu", scaler=ScalerConfig(init_scale=4.0, min_scale=1.0))
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert _fp16_step(policy, model, opt, poison=True) is False  # 4 -> 2
    assert _fp16_step(policy, model, opt, poison=True) is False  # 2 -> 1, still at the floor
    with pytest.raises(LossScaleCollapse, match="below min_scale"):
        _fp16_step(policy, model, opt, poison=True)  # 1 -> 0.5
