"""The analytic ledger against the traced one (a real step on fake tensors) and a measured real step."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import replace

import pytest

from ampkit.errors import UsageError
from ampkit.models.loss import chunk_rows
from ampkit.plan.analytic.ledger import StepReplay, analytic_ledger
from ampkit.plan.describe import describe_config, describe_model
from ampkit.plan.optim import optimizer_state_bytes
from ampkit.plan.planner import agreement
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced.trace import check_traceable, trace_step, traced_ledger
from ampkit.plan.traced.tracker import TENSOR_LINES

TINY = describe_model("tiny")
SMALL = describe_model("small")
HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


def assert_agree(desc, setting):
    analytic, traced = analytic_ledger(desc, setting), traced_ledger(desc, setting)
    agree = agreement(analytic, traced)
    assert abs(agree["tensor_peak_relative"]) <= 0.05, agree
    for line, stats in agree["lines"].items():
        assert stats["within"], (line, stats)
    return analytic, traced


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "fp16-mixed", "bf16-true"])
def test_tiny_analytic_agrees_with_traced(precision, optimizer, checkpointing):
    setting = StepSetting(
        precision=precision, optimizer=optimizer, checkpointing=checkpointing, micro_batch=2, seq_len=64
    )
    analytic, traced = assert_agree(TINY, setting)
    assert analytic.peak_moment.split(" ")[:2] == traced.peak_moment.split(" ")[:2]  # same phase of the step


@pytest.mark.parametrize("precision", ["tf32", "fp16-true"])
def test_tiny_other_regimes_agree(precision):
    assert_agree(TINY, StepSetting(precision=precision, micro_batch=2, seq_len=64))


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_gradient_accumulation_and_momentum_agree(precision):
    assert_agree(
        TINY, StepSetting(precision=precision, optimizer="sgd-momentum", micro_batch=2, seq_len=64, grad_accum=2)
    )


def test_grouped_query_attention_and_large_vocabulary_agree():
    config = {
        "model_type": "llama",
        "hidden_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 352,
        "vocab_size": 4000,
        "tie_word_embeddings": True,
    }
    desc = describe_config(config)
    for precision in ("fp32", "bf16-mixed"):
        assert_agree(desc, StepSetting(precision=precision, micro_batch=1, seq_len=32))


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes not installed: adamw-8bit is planned analytically only")
@pytest.mark.parametrize("precision", ["fp32", "bf16-true"])
def test_adamw_8bit_agrees_with_bitsandbytes(precision):
    assert_agree(TINY, StepSetting(precision=precision, optimizer="adamw-8bit", micro_batch=2, seq_len=64))


@pytest.mark.parametrize("precision,checkpointing", [("fp32", "none"), ("bf16-mixed", "full")])
def test_small_analytic_agrees_with_traced(precision, checkpointing):
    assert_agree(SMALL, StepSetting(precision=precision, checkpointing=checkpointing, micro_batch=2, seq_len=128))


def moment_peaks(desc, setting) -> dict[str, int]:
    """The analytic replay's highest point per moment, under the traced step's labels."""
    analytic: dict[str, int] = {}
    for moment, total in StepReplay(desc, setting).run().moment_peaks.items():
        key = re.sub(r"^(backward: block \d+).*", r"\1", moment)
        analytic[key] = max(analytic.get(key, 0), total)
    return analytic


def test_small_timeline_agrees_block_by_block():
    """Not only the peak: the highest point of each phase (loss, head, first/last block...)."""
    setting = StepSetting(precision="fp32", micro_batch=2, seq_len=128)
    traced = trace_step(SMALL, setting).label_peaks
    analytic = moment_peaks(SMALL, setting)
    compared = [k for k in traced if k in analytic]
    assert {"backward: loss", "backward: block 7", "backward: block 0", "optimizer step"} <= set(compared)
    for key in compared:
        assert analytic[key] == pytest.approx(traced[key], rel=0.01), key


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_loss_agrees_chunk_by_chunk_on_a_wide_vocabulary(precision):
    """A vocabulary wide enough that the loss region is the step's peak, and a batch of two loss
    chunks (`ampkit.models.loss`): the analytic lines follow the traced step from the logits to the
    optimizer (the saved logits and one chunk's fp32 buffers, never two)."""
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    config |= {"num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 8000, "tie_word_embeddings": True}
    desc, setting = describe_config(config), StepSetting(precision=precision, micro_batch=4, seq_len=256)
    assert 1 < setting.tokens / chunk_rows(setting.tokens, 8000) <= 2
    traced, analytic = trace_step(desc, setting).label_peaks, moment_peaks(desc, setting)
    moments = ["forward: logits and loss", "backward: loss", "backward: final norm", "backward: block 0"]
    for moment in [*moments, "optimizer step"]:
        assert analytic[moment] == pytest.approx(traced[moment], rel=0.01), moment
    planned, traced_peak = analytic_ledger(desc, setting).tensor_peak, traced_ledger(desc, setting).tensor_peak
    assert planned == pytest.approx(traced_peak, rel=0.01)


def test_traced_matches_a_measured_real_cpu_step():
    from ampkit.plan.traced.measure import measure_cpu_step_peak

    setting = StepSetting(precision="fp32", micro_batch=2, seq_len=64)
    measured = measure_cpu_step_peak(SMALL, setting)
    traced = traced_ledger(SMALL, setting).tensor_peak
    assert traced == pytest.approx(measured, rel=0.10)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_fp8_emulated_total_agrees(checkpointing):
    """torchao's float8 Linears trace on fake tensors; their eager scaling scratch is modeled coarsely,
    so the total is held to the 5% tolerance and the lines are reported, not asserted."""
    setting = StepSetting(precision="fp8-emulated", checkpointing=checkpointing, micro_batch=2, seq_len=128)
    analytic, traced = analytic_ledger(SMALL, setting), traced_ledger(SMALL, setting)
    assert analytic.tensor_peak == pytest.approx(traced.tensor_peak, rel=0.05)
    for line in ("parameters", "gradients", "optimizer_states", "weight_copies"):
        assert analytic.at_peak[line] == pytest.approx(traced.at_peak[line], rel=0.10, abs=1)


def test_lines_sum_to_the_peak_and_reserve_is_added():
    led = analytic_ledger(TINY, StepSetting(precision="bf16-mixed", micro_batch=4, seq_len=128))
    assert set(led.at_peak) == set(TENSOR_LINES)
    assert led.total == led.tensor_peak + led.reserve and led.reserve > 0
    assert led.at_peak["master_weights"] == 0  # mixed precision's fp32 parameters are the master copy


def test_mixed_adam_is_16_bytes_per_parameter_before_activations():
    """16 bytes per parameter, as in ZeRO's accounting (Rajbhandari et al. 2020, arXiv:1910.02054, sec. 3.1):
    fp32 weights 4 + fp32 grads 4 + Adam's two fp32 states 8."""
    led = analytic_ledger(describe_model("7b"), StepSetting(precision="bf16-mixed", seq_len=16))
    n = describe_model("7b").num_parameters()
    static = led.largest["parameters"] + led.largest["gradients"] + led.largest["optimizer_states"]
    assert static / n == pytest.approx(16, abs=1e-4)


def test_optimizer_state_rules():
    tensors = [10_000, 1_000]  # one 8-bit tensor, one kept in 32 bits (< 4,096 elements)
    assert optimizer_state_bytes("adamw", tensors, param_bytes=4) == 8 * 11_000 + 2 * 4
    assert optimizer_state_bytes("adamw", tensors, param_bytes=2) == 4 * 11_000 + 2 * 4
    assert optimizer_state_bytes("sgd-no-momentum", tensors, param_bytes=4) == 0
    assert optimizer_state_bytes("sgd", tensors, param_bytes=4) == 4 * 11_000  # train's sgd: momentum 0.9
    assert optimizer_state_bytes("sgd-momentum", tensors, param_bytes=4) == 4 * 11_000  # its former name
    eight = optimizer_state_bytes("adamw-8bit", tensors, param_bytes=4)
    assert eight == 2 * 10_000 + 2 * 4 * 40 + 8 * 1_000 + 2 * 256 * 4


def test_8bit_states_are_about_a_quarter_of_32bit_at_scale():
    desc = describe_model("7b")
    full = optimizer_state_bytes("adamw", desc.parameter_tensors(), param_bytes=4)
    eight = optimizer_state_bytes("adamw-8bit", desc.parameter_tensors(), param_bytes=4)
    assert eight / full == pytest.approx(0.25, abs=0.01)


def test_fp8_is_bf16_mixed_without_block_weight_copies():
    base = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=256)
    desc = describe_model("1b")
    mixed, fp8 = analytic_ledger(desc, base), analytic_ledger(desc, replace(base, precision="fp8"))
    assert fp8.largest["activations"] == mixed.largest["activations"]
    head_copy = 2 * desc.vocab_size * desc.d_model
    assert fp8.largest["weight_copies"] == head_copy < mixed.largest["weight_copies"]


def test_checkpointing_cuts_activations_and_fsdp_divides_static_lines():
    desc = describe_model("7b")
    base = StepSetting(precision="bf16-mixed", micro_batch=4, seq_len=4096)
    plain, ckpt = analytic_ledger(desc, base), analytic_ledger(desc, replace(base, checkpointing="full"))
    assert ckpt.largest["activations"] < plain.largest["activations"] / 10
    sharded = analytic_ledger(desc, replace(base, parallel="fsdp", world_size=8))
    for line in ("parameters", "gradients", "optimizer_states"):
        assert sharded.largest[line] == pytest.approx(plain.largest[line] / 8, rel=1e-6)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_depth_folding_is_exact(checkpointing):
    """Middle blocks are replayed as lumps: the answer equals the block-by-block replay's."""
    setting = StepSetting(precision="bf16-mixed", checkpointing=checkpointing, micro_batch=2, seq_len=64)
    folded = analytic_ledger(SMALL, setting)
    unfolded = StepReplay(SMALL, setting)
    unfolded._folded = lambda k: False  # every block replayed on its own
    replay = unfolded.run()
    assert replay.peak == folded.tensor_peak and replay.peak_lines == folded.at_peak


def test_trace_refuses_what_it_cannot_run():
    gpt2 = describe_config(
        {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 50, "n_positions": 64}
    )
    with pytest.raises(UsageError, match="cannot trace"):
        check_traceable(gpt2, StepSetting(precision="fp32"))
    with pytest.raises(UsageError, match="native fp8"):
        check_traceable(TINY, StepSetting(precision="fp8"))
    with pytest.raises(UsageError, match="world-size"):
        check_traceable(TINY, StepSetting(precision="fp32", world_size=2, parallel="fsdp"))


def test_gpt2_and_opt_ledgers_are_finite_and_ordered():
    gpt2 = describe_config(
        {
            "model_type": "gpt2",
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "vocab_size": 50257,
            "n_positions": 1024,
            "resid_pdrop": 0.1,
        }
    )
    small, large = (
        analytic_ledger(gpt2, StepSetting(precision="bf16-mixed", micro_batch=m, seq_len=1024)) for m in (1, 8)
    )
    assert 0 < small.total < large.total
    with pytest.raises(UsageError, match="n_positions|1024"):
        analytic_ledger(gpt2, StepSetting(precision="bf16-mixed", seq_len=2048))  # learned positions end at 1024
    with pytest.raises(UsageError):
        StepSetting(precision="bf16-mixed", micro_batch=0)
