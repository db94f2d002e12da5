"""ampkit.diagnostics.fixes: keep one module in fp32 under autocast (the precision policy's override)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.diagnostics.fixes import keep_in_fp32


class _Boom(nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def test_only_the_kept_module_computes_in_fp32():
    model = keep_in_fp32(_model(), "1", device_type="cpu")
    dtypes = []
    for layer in model:
        layer.register_forward_hook(lambda m, args, out: dtypes.append((args[0].dtype, out.dtype)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.ones(2, 4))
    # a hook sees what arrives (the first layer's bf16 output); inside, the input is cast to fp32: fp32 out
    assert dtypes == [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)]


def test_outside_autocast_nothing_changes():
    plain, kept = _model(), keep_in_fp32(_model(), "0", device_type="cpu")
    x = torch.randn(3, 4)
    assert torch.equal(plain(x), kept(x))
    assert list(kept.state_dict()) == list(plain.state_dict())  # same keys: checkpoints stay loadable


def test_a_forward_that_raises_still_closes_the_fp32_region():
    model = keep_in_fp32(nn.Sequential(_Boom()), "0", device_type="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="boom"):
            model(torch.ones(1))
        assert torch.is_autocast_enabled("cpu")  # the disabled region did not leak


def test_keep_in_fp32_and_doctors_keep_fp32_are_the_policys_one_override():
    """No second implementation: the fix marks the module as the policy's override does, and doctor's
    --keep-fp32 is the `ModuleOverrides` its policy applies in `convert_module`."""
    from ampkit.diagnostics.config import DoctorConfig
    from ampkit.precision import ModuleOverrides, build_precision
    from ampkit.precision.overrides import MARK

    fixed = keep_in_fp32(_model(), "1", device_type="cpu")
    assert getattr(fixed[1], MARK).regime == "fp32" and getattr(fixed[0], MARK, None) is None
    config = DoctorConfig.of(precision="bf16-mixed", keep_fp32="blocks.1.mlp, blocks.*.attn")
    assert config.overrides == ModuleOverrides.keep_fp32(["blocks.1.mlp", "blocks.*.attn"])
    assert config.fp32_paths == ["blocks.1.mlp", "blocks.*.attn"]
    policy = build_precision("bf16-mixed", device_type="cpu", overrides=ModuleOverrides.keep_fp32("1"))
    by_policy = policy.convert_module(_model())
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(by_policy(x), fixed(x))  # the same region, however it was applied


def test_doctor_refuses_a_keep_fp32_pattern_that_matches_nothing_in_one_line():
    from ampkit.diagnostics.config import DoctorConfig
    from ampkit.diagnostics.doctor import run_doctor
    from ampkit.errors import UsageError

    with pytest.raises(UsageError, match=r"'blocks.9.mlp' matches no module"):
        run_doctor(DoctorConfig.of(precision="bf16-mixed", keep_fp32="blocks.9.mlp", steps=1, smoke=False))
