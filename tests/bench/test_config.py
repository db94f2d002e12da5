"""BenchConfig checks, precision lists per device, and up-front refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ampkit.bench.config import BenchConfig, default_precisions, parse_precisions, resolve_for_device
from ampkit.bench.memory_check import check_bench_fits
from ampkit.config import replace_settings
from ampkit.errors import UsageError
from ampkit.hardware import parse_cpuinfo
from ampkit.hardware.device import describe_cpu
from ampkit.lora import LoraSettings

AVX2_CPU = describe_cpu(parse_cpuinfo("model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n"))


def cuda_info(cc: tuple[int, int], **overrides):
    base = dict(
        type="cuda",
        kind="cuda",
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
    assert (resolved.model.model, resolved.data.seq_len, resolved.data.batch_size) == ("tiny", 256, 8)
    assert len(warnings) == 2 and all("emulated" in w for w in warnings)


def test_tf32_on_a_cpu_is_refused_with_the_fix():
    with pytest.raises(UsageError, match="tf32 needs .* use fp32"):
        resolve_for_device(BenchConfig(precisions="tf32"), AVX2_CPU)


def test_cuda_defaults_follow_the_card():
    assert default_precisions(cuda_info((7, 0))) == ["fp32", "fp16-mixed"]  # V100: no tf32, no bf16
    ampere = default_precisions(cuda_info((8, 0)))
    assert ampere[:4] == ["fp32", "tf32", "fp16-mixed", "bf16-mixed"] and "fp8" not in ampere
    resolved, _, _ = resolve_for_device(BenchConfig(), cuda_info((9, 0)))
    assert resolved.model.model == "gpt2-124m" and resolved.data.seq_len == 512


def test_memory_check_refuses_a_model_too_big_with_the_planner_estimate(monkeypatch):
    monkeypatch.setattr("ampkit.plan.fit_check.host_available_bytes", lambda: 8 * 1024**3)  # an 8 GiB host
    config = BenchConfig.of(model="7b", seq_len=256, batch_size=8)
    with pytest.raises(UsageError, match=r"bench --model 7b --precision fp32 .* cannot fit: .* 8.00 GiB"):
        check_bench_fits(config, ["fp32", "bf16-mixed"], device=torch.device("cpu"))
    tiny = replace_settings(config, {"model": "tiny"})
    estimates = check_bench_fits(tiny, ["fp32", "bf16-mixed"], device=torch.device("cpu"))  # fits: no error
    assert len(estimates) == 2 and all(e.fits and e.max_micro_batch > 8 for e in estimates)
    assert check_bench_fits(dataclasses.replace(config, fit_check=False), ["fp32"], device=torch.device("cpu")) == []


def test_memory_check_skips_a_host_that_does_not_report_its_memory(monkeypatch):
    monkeypatch.setattr("ampkit.plan.fit_check.host_available_bytes", lambda: None)
    config = BenchConfig.of(model="7b", seq_len=256, batch_size=8)
    assert check_bench_fits(config, ["fp32"], device=torch.device("cpu")) == []


def test_a_lora_bench_is_fit_checked_with_the_lora_ledger(monkeypatch):
    # The seed's 7B LoRA bench on one 80 GB card (an A100's reported total, all of it free): full
    # fine-tuning of 7B at this batch needs far more than the card, the LoRA step (frozen bf16 or fp32
    # base, the adapters' gradients and states only) fits, so it is not refused.
    from devices import synthetic_device

    free = synthetic_device("a100").total_memory_bytes
    monkeypatch.setattr("ampkit.plan.fit_check.free_device_memory", lambda device: (free, f"free on {device}"))
    cuda = torch.device("cuda", 0)
    full = BenchConfig.of(model="7b", seq_len=512, batch_size=8)
    with pytest.raises(UsageError, match="cannot fit"):
        check_bench_fits(full, ["fp32", "bf16-mixed"], device=cuda)
    lora = dataclasses.replace(full, lora=LoraSettings(lora=8))
    estimates = check_bench_fits(lora, ["fp32", "bf16-mixed"], device=cuda)
    assert len(estimates) == 2 and all(e.fits and e.max_micro_batch >= 8 for e in estimates)
