"""ampkit.precision.lowbit: the policy of every low-bit format hands the model to its format's converter
and keeps the report; fp32 master weights, bf16 autocast around."""

from __future__ import annotations

import pytest
import torch

from ampkit.precision import SPECS, build_precision
from ampkit.precision.lowbit import LowBitPrecision

pytest.importorskip("torchao")

EMULATED = sorted(name for name, spec in SPECS.items() if spec.converts_linears and spec.emulated)


@pytest.mark.parametrize("precision", EMULATED)
def test_emulated_formats_train_on_the_meta_device_built_model_and_keep_fp32_weights(precision):
    from ampkit.models import LlamaLM, get_preset
    from ampkit.models.init import materialize

    policy = build_precision(precision, device_type="cpu")
    with torch.device("meta"):  # as `ampkit train` builds it: converted on meta, then materialised
        model = policy.convert_module(LlamaLM(get_preset("tiny", n_layers=1)))
    model = materialize(model, device="cpu", seed=0)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    ids = torch.randint(0, 256, (2, 16))
    with policy.forward_context():
        loss = model(ids).float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_only_the_low_bit_policies_report_a_conversion():
    assert build_precision("bf16-mixed", device_type="cpu").conversion() is None
    policy = build_precision("mxfp8-emulated", device_type="cpu")
    assert isinstance(policy, LowBitPrecision) and policy.conversion() is None  # nothing converted yet
    assert type(policy.converter()).__name__ == "MXFP8Converter" and policy.converter().emulated
