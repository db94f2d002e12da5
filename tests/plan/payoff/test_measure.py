"""`plan --formats --measure`: one line where there is no NVIDIA GPU; on one, the model's GEMMs timed."""

from __future__ import annotations

import pytest
import torch

from ampkit.plan.describe import describe_model
from ampkit.plan.payoff import parse_formats, payoff_plan
from ampkit.plan.payoff.measure import measure_formats, measure_linear
from helpers import cpu_runs_fp8_matmuls


def _block(model: str, formats: str, tokens: int) -> dict:
    return payoff_plan(describe_model(model), formats=formats, micro_batch=1, seq_len=tokens)


def test_measure_skips_in_one_line_on_a_cpu():
    block = _block("tiny", "fp8", 64)
    measured = measure_formats(block, parse_formats("fp8"), device="cpu")
    assert measured["skipped"].startswith("--measure times GEMMs on an NVIDIA GPU; this is ")
    assert "\n" not in measured["skipped"] and "layers" not in measured


def test_the_timed_gemms_and_casts_run_on_any_device_torch_has_scaled_mm_on():
    """The code --measure runs, on this CPU (torch's CPU `_scaled_mm`): shapes right, every time positive.
    The times mean nothing here; on a GPU they are the measurement (the test below)."""
    if not cpu_runs_fp8_matmuls():
        pytest.skip("this CPU's oneDNN has no float8 matmul (AVX2 only): no CPU _scaled_mm to run the code on")
    linear = {"name": "up_proj", "k": 64, "n": 96}
    out = measure_linear(torch.device("cpu"), 32, linear, parse_formats("fp8,fp8:rowwise"))
    assert out["name"] == "up_proj" and out["bf16_s"] > 0 and set(out["formats"]) == {"fp8", "fp8:rowwise"}
    assert all(f["kernel_s"] > 0 and f["quantize_s"] > 0 for f in out["formats"].values())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_measure_times_bf16_and_fp8_gemms_and_their_casts_on_the_gpu():
    formats = "fp8,fp8:rowwise,nvfp4"
    block = _block("1b", formats, 4096)
    measured = measure_formats(block, parse_formats(formats), device="cuda")
    assert measured["skipped"] is None and "nvfp4" in measured["not_timed"]  # block formats: never timed here
    names = [layer["name"] for layer in measured["layers"]]
    assert names == [linear["name"] for linear in block["linears"] if not linear["head"]]
    widest = max(measured["layers"], key=lambda layer: layer["k"] * layer["n"])
    for layer in measured["layers"]:
        assert layer["bf16_s"] > 0
        for label in measured["timed"]:
            f = layer["formats"][label]
            assert f["kernel_s"] > 0 and f["quantize_s"] > 0 and f["with_overhead"] < f["kernel_only"]
    if measured["timed"]:  # an fp8 GPU: its fp8 GEMMs beat bf16 on the model's widest Linear at 4,096 tokens
        assert widest["formats"]["fp8"]["kernel_only"] > 1.0
