"""fp8 only where it pays: the roofline model on hand-computed cases and torchao's published H100
shapes, the conversion filter on a model, the plan's per-layer prediction, fp8 under FSDP2."""

from __future__ import annotations

import math

import pytest
import torch

from ampkit.hardware.gpus import GPUS
from ampkit.plan.analytic.fp8 import fp8_plan
from ampkit.plan.describe import describe_model
from ampkit.precision import Fp8Options, build_precision
from ampkit.precision.fp8 import converted_layers
from ampkit.precision.fp8_roofline import Roofline, linear_seconds, predicted_speedup
from ampkit.tasks.lm import LanguageModelTask

H100 = Roofline.from_gpu(GPUS["H100-80GB"])


def test_a_compute_bound_gemm_by_hand():
    device = Roofline.from_peaks(bandwidth=1e15, bf16=1e12, fp8=2e12)  # bandwidth so high nothing is memory-bound
    m, k, n = 1000, 2000, 3000
    assert linear_seconds(m, k, n, device, recipe=None) == pytest.approx(3 * 2 * m * k * n / 1e12)
    fp8 = 3 * 2 * m * k * n / 2e12 + 5 * (m * k + k * n + m * n) / 1e15  # GEMMs at the fp8 peak + tensorwise casts
    assert linear_seconds(m, k, n, device, recipe="tensorwise") == pytest.approx(fp8)


def test_a_memory_bound_gemm_by_hand():
    device = Roofline.from_peaks(bandwidth=1e9, bf16=1e18, fp8=2e18)  # compute free: bytes decide
    m = k = n = 100
    bf16 = 3 * (2 * (m * k + k * n) + 2 * m * n) / 1e9
    assert linear_seconds(m, k, n, device, recipe=None) == pytest.approx(bf16)
    fp8 = 3 * (1 * (m * k + k * n) + 2 * m * n) / 1e9 + 5 * 3 * m * k / 1e9
    assert linear_seconds(m, k, n, device, recipe="tensorwise") == pytest.approx(fp8)
    assert predicted_speedup(m, k, n, device) < 1  # casting costs more than the smaller reads save


def test_torchaos_published_h100_shapes():
    assert predicted_speedup(1024, 2048, 1024, H100) < 1.0  # slower in fp8
    assert predicted_speedup(4096, 8192, 16384, H100) > 1.0  # faster
    for recipe in ("rowwise", "rowwise_with_gw_hp"):  # more casting (rowwise) or dW in bf16: less gain
        assert predicted_speedup(4096, 8192, 16384, H100, recipe=recipe) < predicted_speedup(4096, 8192, 16384, H100)


def test_only_the_linears_that_pay_are_converted():
    task = LanguageModelTask(model="small", seq_len=64)
    compute_bound = Roofline.from_peaks(bandwidth=1e18, bf16=1e15, fp8=2e15)  # casts nearly free: fp8 pays
    for device, expect_any in ((H100, False), (compute_bound, True)):  # small's 512-wide GEMMs at 64 tokens
        model = task.build_model(device=torch.device("cpu"), seed=0)
        options = Fp8Options(tokens=64, roofline=device)
        build_precision("fp8-emulated", device_type="cpu", fp8=options).convert_module(model)
        assert bool(converted_layers(model)) is expect_any
    model = task.build_model(device=torch.device("cpu"), seed=0)
    build_precision("fp8-emulated", device_type="cpu").convert_module(model)  # no roofline: every eligible Linear
    assert len(converted_layers(model)) == 7 * 8 and "lm_head" not in converted_layers(model)


def test_the_plan_lists_each_layers_prediction_and_warns_when_fp8_does_not_pay():
    big = fp8_plan(describe_model("7b"), micro_batch=4, seq_len=4096, gpu=GPUS["H100-80GB"])
    assert big["converted_layers"] == 7 and big["speedup"] > 1.05 and "warning" not in big
    assert math.isclose(big["converted_flops_share"], 1.0)
    small = fp8_plan(describe_model("small"), micro_batch=1, seq_len=128, gpu=GPUS["H100-80GB"])
    assert small["converted_layers"] == 0 and "warning" in small
    assert fp8_plan(describe_model("7b"), micro_batch=1, seq_len=128, gpu=GPUS["A100-80GB"]) is None  # no fp8 peak
