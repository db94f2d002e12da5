"""The traced ledger extrapolated from shallow traces equals the full trace (24-layer tiny models of
several architectures, settings), and falls back to the full trace when the layers do not allow it."""

from __future__ import annotations

import pytest

from ampkit.plan.describe import describe_model
from ampkit.plan.setting import NO_RESERVE, StepSetting
from ampkit.plan.traced import extrapolate
from ampkit.plan.traced.extrapolate import HFTracedEngine, memory_class, moment_keys, shard, table_of
from ampkit.plan.traced.hf import trace_hf_step
from ampkit.plan.traced.tracker import TENSOR_LINES
from hf_archs import save_tiny

pytest.importorskip("transformers")

KWARGS = {"reserve": NO_RESERVE}


def described(tmp_path, model_type, layers, **overrides):
    save_tiny(tmp_path, model_type, layers=layers, **overrides)
    return describe_model(f"hf:{tmp_path}")


def full_trace(desc, setting):
    key, lines = table_of(trace_hf_step(desc, setting, depth=desc.n_layers)).peak()
    return key, lines


CASES = [  # (architecture, precision, checkpointing, grad_accum)
    ("llama", "bf16-mixed", "none", 1),
    ("llama", "fp32", "full", 2),
    ("qwen3", "bf16-true", "none", 1),
    ("gemma2", "fp16-mixed", "none", 1),  # sliding/global alternation: extrapolated over its period of 2
    ("mixtral", "bf16-mixed", "full", 1),  # mixture of experts
    ("deepseek_v3", "fp32", "none", 1),  # a dense first layer, then MoE ones
]


@pytest.mark.parametrize(("model_type", "precision", "checkpointing", "grad_accum"), CASES)
def test_extrapolated_equals_the_full_trace_of_24_layers(tmp_path, model_type, precision, checkpointing, grad_accum):
    desc = described(tmp_path, model_type, 24)
    setting = StepSetting(
        precision=precision, checkpointing=checkpointing, micro_batch=2, seq_len=32, grad_accum=grad_accum
    )
    engine = HFTracedEngine(desc, **KWARGS)
    ledger = engine.ledger(setting)
    assert engine.extrapolating, engine.note
    assert "extrapolated from traces of" in engine.note
    moment, lines = full_trace(desc, setting)
    total = sum(lines.values())
    assert abs(ledger.tensor_peak - total) <= 0.01 * total  # acceptance: within 1% (it is exact)
    for line in TENSOR_LINES:
        assert abs(ledger.at_peak[line] - lines[line]) <= 0.01 * total, line
    assert ledger.peak_moment == moment


def test_block_moments_are_keyed_by_position():
    assert moment_keys("backward: block 0", prefix=0, period=1, repeats=1) == [
        "backward: first repeat, block 0",
        "backward: last repeat, block 0",
    ]
    assert moment_keys("backward: block 2", prefix=1, period=1, repeats=2) == ["backward: last repeat, block 0"]
    assert moment_keys("forward: block 0 recompute", prefix=1, period=2, repeats=2) == [
        "forward: prefix block 0 recompute"
    ]
    assert moment_keys("backward: loss", prefix=0, period=1, repeats=2) == ["backward: loss"]
    assert moment_keys("backward: block 1", prefix=0, period=1, repeats=3) == []  # a middle repeat: dominated


def test_failed_check_traces_in_full_and_says_why(tmp_path, monkeypatch):
    desc = described(tmp_path, "llama", 6)
    setting = StepSetting(precision="fp32", micro_batch=1, seq_len=16)
    monkeypatch.setattr(extrapolate, "agrees", lambda predicted, traced: False)
    engine = HFTracedEngine(desc, **KWARGS)
    ledger = engine.ledger(setting)
    assert engine.extrapolating is False and "does not match the extrapolation" in engine.note
    assert ledger.tensor_peak == sum(full_trace(desc, setting)[1].values())


def test_few_layers_are_traced_in_full(tmp_path):
    desc = described(tmp_path, "llama", 3)
    engine = HFTracedEngine(desc, **KWARGS)
    engine.ledger(StepSetting(precision="fp32", micro_batch=1, seq_len=16))
    assert engine.extrapolating is False and "traced in full" in engine.note


def test_precisions_with_the_same_bytes_share_a_trace():
    assert memory_class("fp32") == memory_class("tf32")
    assert memory_class("bf16-mixed") == memory_class("fp16-mixed")
    assert memory_class("bf16-true") == memory_class("fp16-true")
    assert memory_class("fp8") == memory_class("fp8-emulated") != memory_class("bf16-mixed")


def test_fsdp_divides_the_state_and_adds_two_gathered_layers(tmp_path):
    desc = described(tmp_path, "qwen3", 8)
    engine = HFTracedEngine(desc, **KWARGS)
    one = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=16)
    four = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=16, world_size=4, parallel="fsdp")
    a, b = engine.ledger(one), engine.ledger(four)
    lines = engine.table(one).peak()[1]
    sharded = shard(lines, desc, four)
    assert sharded["parameters"] == lines["parameters"] // 4 and sharded["weight_copies"] == 0
    assert sharded["temporaries"] == lines["temporaries"] + 2 * 2 * desc.block_parameters()
    assert b.tensor_peak < a.tensor_peak
    ddp = engine.ledger(StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=16, world_size=4, parallel="ddp"))
    assert ddp.at_peak == a.at_peak


def test_largest_micro_batch_and_sequence_are_the_edges(tmp_path):
    desc = described(tmp_path, "gemma2", 8)  # eager attention: memory quadratic in the sequence
    engine = HFTracedEngine(desc, reserve=NO_RESERVE)
    setting = StepSetting(precision="bf16-mixed", micro_batch=2, seq_len=32)
    capacity = engine.ledger(setting).total + 200_000
    for field, value in (("micro_batch", None), ("seq_len", None)):
        best = engine.largest(setting, capacity, field=field)
        assert best >= 1
        at = StepSetting(**{**setting.to_dict(), field: best})
        over = StepSetting(**{**setting.to_dict(), field: best + 1})
        assert engine.ledger(at).total <= capacity < engine.ledger(over).total, (field, value, best)


@pytest.mark.parametrize(("family", "linear"), [("qwen3", True), ("gemma2", False)])
def test_the_sequence_edge_from_a_line_or_three_lengths(tmp_path, family, linear):
    """SDPA models grow linearly in the sequence: the micro-batch pair and one check trace place the edge
    of every setting; eager attention (Gemma 2) fails the check and traces three lengths a setting."""
    desc = described(tmp_path, family, 8)
    engine = HFTracedEngine(desc, reserve=NO_RESERVE)
    first, other = (StepSetting(precision=p, micro_batch=2, seq_len=64) for p in ("bf16-mixed", "fp32"))
    assert engine.sequences.linear(first) is linear
    for setting in (first, other):
        capacity = int(1.2 * engine.ledger(setting).total)
        best = engine.largest(setting, capacity, field="seq_len")
        assert best < desc.max_positions
        at, over = (engine.ledger(StepSetting(**{**setting.to_dict(), "seq_len": t})).total for t in (best, best + 1))
        assert best > 64 and at <= capacity < over, (setting.label(), best)


def test_fp8_takes_its_square_term_from_bf16_mixed_and_finds_its_own_edge(tmp_path):
    """Eager attention (Gemma 2): fp8's T x T tensors are bf16-mixed's (made outside the float8 block
    Linears), so fp8's largest sequence reads bf16-mixed's trace at the check length, none of its own,
    and is still the edge of fp8's own ledgers."""
    pytest.importorskip("torchao")
    desc = described(tmp_path, "gemma2", 8, hidden_size=64, intermediate_size=128)
    engine = HFTracedEngine(desc, reserve=NO_RESERVE)
    first = StepSetting(precision="fp32", micro_batch=2, seq_len=64)
    assert engine.sequences.linear(first) is False
    fp8 = StepSetting(precision="fp8-emulated", micro_batch=2, seq_len=64)
    assert engine.sequences.donor(fp8).precision == "bf16-mixed"
    longer = StepSetting(precision="fp8-emulated", micro_batch=2, seq_len=128)
    capacity = int(1.2 * engine.ledger(fp8).total)
    best = engine.largest(fp8, capacity, field="seq_len")
    assert not engine.steps.has(longer, desc.pattern.depth(1))  # fp8 traced no length of its own
    at, over = (engine.ledger(StepSetting(**{**fp8.to_dict(), "seq_len": t})).total for t in (best, best + 1))
    assert best > 64 and at <= capacity < over, best
    assert engine.ledger(fp8).total != engine.ledger(StepSetting(**{**fp8.to_dict(), "precision": "bf16-mixed"})).total


def test_a_step_over_the_gpu_at_micro_batch_1_fits_nothing_without_other_steps(tmp_path):
    """Over the budget at micro-batch 1: the largest micro-batch is 0 from that step alone (what the
    line through micro-batches 1 and 2 gives too); weights, gradients and states alone over it: the
    largest sequence is 0 too, with no step of another length."""
    desc = described(tmp_path, "qwen3", 8)
    engine = HFTracedEngine(desc, reserve=NO_RESERVE)
    setting = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=32)
    moments = engine.moments(setting)
    weights = max(sum(lines[n] for n in extrapolate._WEIGHT_LINES) for lines in moments.values())
    traced = engine.steps.traced
    assert engine.fit(setting, engine.ledger(setting).total, weights - 1).to_dict()["max_micro_batch"] == 0
    assert engine.largest(setting, weights - 1, field="seq_len") == 0
    assert engine.steps.traced == traced  # neither micro-batch 2 nor another length
    between = (weights + engine.ledger(setting).tensor_peak) // 2  # the weights fit, the step does not
    at1, at2 = engine.totals(setting), engine.totals(StepSetting(precision="bf16-mixed", micro_batch=2, seq_len=32))
    assert engine.largest(setting, between, field="micro_batch") == 0
    assert extrapolate.largest_affine(((at1[k], at2[k]) for k in at1), between, 1 << 24) == 0
    assert 0 < engine.largest(setting, between, field="seq_len") < 32


def test_a_prefetch_leaves_out_the_fits_of_steps_whose_weights_exceed_the_gpu(tmp_path, monkeypatch):
    desc = described(tmp_path, "llama", 8)
    engine = HFTracedEngine(desc, reserve=NO_RESERVE)
    fp32, true = (StepSetting(precision=p, micro_batch=1, seq_len=32) for p in ("fp32", "bf16-true"))
    assert engine.weights_floor(true) < engine.weights_floor(fp32)
    asked: list[StepSetting] = []
    monkeypatch.setattr(engine, "_split", lambda wanted, needed: asked.extend(needed))
    engine.prefetch([fp32, true], capacity=(engine.weights_floor(true) + engine.weights_floor(fp32)) // 2)
    two = {s.precision for s in asked if s.micro_batch == 2 and s.seq_len == 32}
    assert {fp32, true} <= set(asked) and two == {"fp32", "bf16-true"}  # fp32's pair only for the check
    assert set(engine.sequences.check_settings(fp32)) <= set(asked)  # the check stays on the first setting
    asked.clear()
    engine.prefetch([fp32, true], capacity=engine.weights_floor(true) // 2)  # neither fits: no fit steps
    assert asked == [fp32, true]
