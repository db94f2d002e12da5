"""Settings that allocate the same tensors share one trace: the shared trace gives, byte for byte, what
a separate trace of each setting gives (the unshared result, traced here beside it), fp16-mixed's
loss scaler included; and a plan traces each shared step once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ampkit.plan.describe import describe_model
from ampkit.plan.setting import NO_RESERVE, StepSetting
from ampkit.plan.traced.extrapolate import HFTracedEngine, extrapolate, fit_settings, table_of
from ampkit.plan.traced.hf import trace_hf_step
from ampkit.plan.traced.sharing import (
    SCALER_BACKWARD_BYTES,
    memory_class,
    scaler_bytes_at,
    shared_precision,
    shared_setting,
)
from ampkit.plan.traced.steps import StepTraces
from hf_archs import save_tiny

pytest.importorskip("transformers")


def described(tmp_path, model_type, layers=6):
    save_tiny(tmp_path, model_type, layers=layers)
    return describe_model(f"hf:{tmp_path}")


def unshared(desc, setting, depth):
    """`setting`'s own step, traced as itself."""
    return trace_hf_step(desc, setting, depth=depth).trace()


def test_each_class_is_traced_as_its_first_member_without_a_scaler():
    assert shared_precision("tf32") == shared_precision("fp32") == "fp32"
    assert shared_precision("fp16-mixed") == shared_precision("bf16-mixed") == "bf16-mixed"
    assert shared_precision("fp16-true") == shared_precision("bf16-true") == "bf16-true"
    assert shared_precision("fp8") == shared_precision("fp8-emulated") == "fp8-emulated"
    assert memory_class("bf16-mixed") != memory_class("bf16-true") != memory_class("fp32")


def test_the_scaler_is_alive_from_the_backward_on():
    assert scaler_bytes_at("forward: block 0") == scaler_bytes_at("forward: logits and loss") == 0
    assert scaler_bytes_at("backward: loss") == scaler_bytes_at("forward: block 3 recompute") == SCALER_BACKWARD_BYTES
    assert scaler_bytes_at("backward: last repeat, block 0") == SCALER_BACKWARD_BYTES
    assert scaler_bytes_at("optimizer step") > 0


CASES = [  # (architecture, precision, optimizer, checkpointing, grad_accum)
    ("llama", "fp16-mixed", "adamw", "none", 1),
    ("llama", "fp16-mixed", "sgd", "full", 1),
    ("qwen3", "fp16-mixed", "adamw", "full", 2),
    ("gemma2", "fp16-mixed", "adamw", "none", 1),
    ("mixtral", "fp16-mixed", "adamw", "none", 1),
    ("llama", "tf32", "adamw", "full", 1),
    ("qwen3", "fp16-true", "sgd", "none", 2),
    ("llama", "fp8", "adamw", "none", 1),
]


@pytest.mark.parametrize(("model_type", "precision", "optimizer", "checkpointing", "grad_accum"), CASES)
def test_a_shared_trace_is_the_settings_own(tmp_path, model_type, precision, optimizer, checkpointing, grad_accum):
    desc = described(tmp_path, model_type)
    setting = StepSetting(
        precision=precision,
        optimizer=optimizer,
        checkpointing=checkpointing,
        micro_batch=2,
        seq_len=32,
        grad_accum=grad_accum,
    )
    steps = StepTraces(desc)
    own = "fp8-emulated" if precision == "fp8" else precision
    for depth in (1, 2):
        shared = steps.get(setting, depth)
        assert shared == unshared(desc, replace(setting, precision=own), depth), depth
    assert steps.traced == 2  # both depths traced once, as the class's first member
    assert steps.has(shared_setting(setting), 1)


def own_table(desc, setting):
    """`setting`'s table extrapolated from its own (unshared) traces."""
    p = desc.pattern
    one, two = (
        table_of(unshared(desc, setting, p.depth(r)), prefix=p.prefix, period=p.period, repeats=r) for r in (1, 2)
    )
    return extrapolate(one, two, p.repeats, prefix=p.prefix, period=p.period)


def test_the_engine_shares_one_trace_and_gives_the_unshared_ledgers_and_fits(tmp_path):
    desc = described(tmp_path, "llama", layers=8)
    fp16, bf16 = (StepSetting(precision=p, micro_batch=1, seq_len=32) for p in ("fp16-mixed", "bf16-mixed"))
    engine = HFTracedEngine(desc, reserve=NO_RESERVE)
    ledger16, ledger_bf16 = engine.ledger(fp16), engine.ledger(bf16)
    assert engine.steps.traced == 3  # depths 1, 2 and the 3-repeat check, for both precisions
    assert ledger16.tensor_peak - ledger_bf16.tensor_peak == SCALER_BACKWARD_BYTES  # the scaler's own tensors
    for setting in (fp16, bf16, *fit_settings(fp16), *engine.sequences.check_settings(fp16)):  # a fit reads these
        assert engine.table(setting) == own_table(desc, setting), setting.label()
    own = own_table(desc, fp16)
    moment, lines = own.peak()
    assert ledger16.at_peak == lines and ledger16.peak_moment == own.labels[moment] and ledger16.largest == own.largest
    capacity = 4 * ledger16.total
    fit = engine.fit(fp16, ledger16.total, capacity)
    assert fit.max_micro_batch >= 1 and fit.max_seq_len >= 32
