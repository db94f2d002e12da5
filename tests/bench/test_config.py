"""BenchConfig checks, precision lists per device, and up-front refusals."""

from __future__ import annotations

import dataclasses

import pytest

from ampkit.bench.config import BenchConfig, default_precisions, parse_precisions, resolve_for_device
from ampkit.bench.memory_check import check_model_fits, estimate_training_bytes
from ampkit.errors import UsageError
from ampkit.hardware import parse_cpuinfo
from ampkit.hardware.device import describe_cpu
from ampkit.models import get_preset

AVX2_CPU = describe_cpu(parse_cpuinfo("model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n"))


def cuda_info(cc: tuple[int, int], **overrides):
    base = dict(
        type="cuda",
        name="NVIDIA Test GPU",
        compute_capability=cc,
        native_bf16=cc >= (8, 0),
        native_fp16=cc >= (7, 0),
        has_tf32=cc >= (8, 0),
        has_fp8=cc >= (8, 9),
        cpu_flags=frozenset(),
        total_memory_bytes=80 * 1024**3,
        gpu_model=None,
        index=0,
    )
    base.update(overrides)
    return dataclasses.replace(AVX2_CPU, **base)


def test_parse_precisions_canonicalizes_and_puts_fp32_first():
    assert parse_precisions("bf16, fp16") == ["fp32", "bf16-mixed", "fp16-mixed"]
    assert parse_precisions("fp16-mixed,fp32,fp16-mixed") == ["fp32", "fp16-mixed"]
    assert parse_precisions("") == []


def test_unknown_precision_is_refused_when_the_config_is_made():
    with pytest.raises(UsageError, match="unknown precision 'fp7'"):
        BenchConfig(precisions="fp32,fp7")


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan"), float("inf")])
def test_budget_must_be_positive_and_finite(budget):
    with pytest.raises(UsageError, match="--budget-s must be a positive"):
        BenchConfig(budget_s=budget)


def test_min_steps_above_max_steps_is_refused():
    with pytest.raises(UsageError, match="--min-steps 10 exceeds --max-steps 5"):
        BenchConfig(min_steps=10, max_steps=5)


def test_steps_pins_the_measured_range():
    assert BenchConfig(steps=7).measured_steps_range == (7, 7)
    assert BenchConfig(min_steps=2, max_steps=9).measured_steps_range == (2, 9)


def test_cpu_defaults_keep_emulated_precisions_and_warn():
    resolved, names, warnings = resolve_for_device(BenchConfig(), AVX2_CPU)
    assert names == ["fp32", "bf16-mixed", "fp16-mixed"]
    assert (resolved.model, resolved.seq_len, resolved.batch_size) == ("tiny", 256, 8)
    assert len(warnings) == 2 and all("emulated" in w for w in warnings)


def test_tf32_on_a_cpu_is_refused_with_the_fix():
    with pytest.raises(UsageError, match="tf32 needs .* use fp32"):
        resolve_for_device(BenchConfig(precisions="tf32"), AVX2_CPU)


def test_cuda_defaults_follow_the_card():
    assert default_precisions(cuda_info((7, 0))) == ["fp32", "fp16-mixed"]  # V100: no tf32, no bf16
    ampere = default_precisions(cuda_info((8, 0)))
    assert ampere[:4] == ["fp32", "tf32", "fp16-mixed", "bf16-mixed"] and "fp8" not in ampere
    resolved, _, _ = resolve_for_device(BenchConfig(), cuda_info((9, 0)))
    assert resolved.model == "gpt2-124m" and resolved.seq_len == 512


def test_memory_check_refuses_a_model_too_big_with_the_estimate():
    seven_b = get_preset("7b")
    need = estimate_training_bytes(seven_b, "fp32")
    assert need == seven_b.num_parameters() * 4 * 4
    with pytest.raises(UsageError, match=r"model '7b' does not fit: fp32 training needs at least [\d.]+ GiB"):
        check_model_fits(seven_b, ["fp32", "bf16-mixed"], capacity_bytes=need - 1, device_label="test")
    check_model_fits(get_preset("tiny"), ["fp32"], capacity_bytes=need, device_label="test")  # fits: no error
    check_model_fits(seven_b, ["fp32"], capacity_bytes=0, device_label="unknown")  # unknown capacity: no check


def test_bf16_true_needs_half_the_state_bytes():
    tiny = get_preset("tiny")
    assert estimate_training_bytes(tiny, "bf16-true") * 2 == estimate_training_bytes(tiny, "fp32")
