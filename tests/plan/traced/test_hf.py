"""One training step of a transformers model on fake tensors: moments, precisions, experts, in-place models."""

from __future__ import annotations

import pytest
import torch

from ampkit.plan.describe import describe_model
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced.hf import (
    CopyMismatch,
    StepRig,
    as_on_real_tensors,
    build_at_depth,
    trace_hf_step,
    traced_precision,
)
from ampkit.precision import build_precision
from hf_archs import save_tiny

pytest.importorskip("transformers")


def desc_of(tmp_path, model_type, layers=2):
    save_tiny(tmp_path, model_type, layers=layers)
    return describe_model(f"hf:{tmp_path}")


def test_every_moment_of_the_step_is_labelled(tmp_path):
    desc = desc_of(tmp_path, "qwen3", layers=3)
    tracker = trace_hf_step(desc, StepSetting(precision="bf16-mixed", micro_batch=2, seq_len=16), depth=3)
    labels = set(tracker.moments)
    for k in range(3):
        assert {f"forward: block {k}", f"backward: block {k}"} <= labels
    assert {"forward: embedding", "forward: logits and loss", "backward: loss", "backward: output head"} <= labels
    assert {"backward: embedding", "optimizer step"} <= labels
    assert max(total for total, _ in tracker.moments.values()) == tracker.peak_total


def test_checkpointed_blocks_recompute_in_backward(tmp_path):
    desc = desc_of(tmp_path, "llama")
    setting = StepSetting(precision="fp32", micro_batch=1, seq_len=16, checkpointing="full")
    tracker = trace_hf_step(desc, setting, depth=2)
    plain = trace_hf_step(desc, StepSetting(precision="fp32", micro_batch=1, seq_len=16), depth=2)
    assert tracker.largest["activations"] < plain.largest["activations"]  # blocks keep only their inputs


def test_native_fp8_is_traced_as_its_emulation(tmp_path):
    assert traced_precision("fp8") == "fp8-emulated" and traced_precision("bf16-mixed") == "bf16-mixed"
    save_tiny(tmp_path, "llama", hidden_size=64, intermediate_size=128)  # Float8Linear needs 16-aligned, wide dims
    desc = describe_model(f"hf:{tmp_path}")
    tracker = trace_hf_step(desc, StepSetting(precision="fp8", micro_batch=1, seq_len=16), depth=1)
    assert tracker.peak_total > 0 and tracker.peak_lines["weight_copies"] == 0  # no autocast weight caches


@pytest.mark.parametrize("model_type", ["mixtral", "falcon", "bloom", "gemma2"])
def test_experts_in_place_residuals_alibi_and_eager_attention_trace(tmp_path, model_type):
    desc = desc_of(tmp_path, model_type)
    for precision in ("fp32", "bf16-true"):
        tracker = trace_hf_step(desc, StepSetting(precision=precision, micro_batch=2, seq_len=16), depth=2)
        assert tracker.peak_lines["parameters"] > 0


def test_the_real_run_answers_are_undone():
    from transformers import masking_utils
    from transformers.integrations import moe

    before = moe._can_use_grouped_mm, masking_utils.find_packed_sequence_indices
    with as_on_real_tensors():
        assert moe._can_use_grouped_mm is not before[0]
        assert masking_utils.find_packed_sequence_indices(torch.arange(4)[None]) is None
    assert (moe._can_use_grouped_mm, masking_utils.find_packed_sequence_indices) == before


def test_an_unpacked_batch_takes_sdpa_is_causal_path_as_a_real_run(tmp_path, monkeypatch):
    desc = desc_of(tmp_path, "qwen3")
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        calls.append((attn_mask, kwargs.get("is_causal")))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    trace_hf_step(desc, StepSetting(precision="fp32", micro_batch=2, seq_len=16), depth=1)
    assert calls and all(mask is None and causal for mask, causal in calls)  # no (B, 1, T, T) mask


def test_a_copy_with_other_layers_is_refused(tmp_path, monkeypatch):
    desc = desc_of(tmp_path, "llama", layers=4)
    from ampkit.plan.traced import hf as hf_trace

    monkeypatch.setattr(hf_trace, "check_copy", lambda *args: False)
    with pytest.raises(CopyMismatch, match="2-layer copy"):
        build_at_depth(desc, 2, build_precision("fp32", device_type="cpu"))


RIG_CASES = [  # (architecture, precision, optimizer, grad_accum)
    ("llama", "fp32", "adamw", 2),  # kept gradients, remade between steps
    ("qwen3", "bf16-mixed", "sgd", 1),
    ("gemma2", "bf16-true", "adamw", 1),
    ("mixtral", "fp16-mixed", "adamw", 1),
]


@pytest.mark.parametrize(("model_type", "precision", "optimizer", "grad_accum"), RIG_CASES)
def test_a_rig_traces_every_step_as_a_fresh_model(tmp_path, model_type, precision, optimizer, grad_accum):
    desc = desc_of(tmp_path, model_type)
    steps = [
        StepSetting(
            precision=precision, optimizer=optimizer, grad_accum=grad_accum, checkpointing=c, micro_batch=m, seq_len=t
        )
        for c, m, t in (("none", 1, 16), ("full", 2, 16), ("none", 2, 32), ("full", 1, 32))
    ]
    rig = StepRig(desc, steps[0], depth=2)
    for setting in [*steps, steps[0]]:  # in any order, checkpointing on and off, the first again
        assert rig.step(setting).trace() == trace_hf_step(desc, setting, depth=2).trace(), setting.label()


def test_a_rig_of_float8_linears_traces_as_a_fresh_model(tmp_path):
    save_tiny(tmp_path, "llama", hidden_size=64, intermediate_size=128)
    desc = describe_model(f"hf:{tmp_path}")
    one, two = (
        StepSetting(precision="fp8", micro_batch=m, seq_len=16, checkpointing=c) for m, c in ((1, "none"), (2, "full"))
    )
    rig = StepRig(desc, one, depth=1)
    for setting in (one, two, one):
        assert rig.step(setting).trace() == trace_hf_step(desc, setting, depth=1).trace()


def test_the_device_shortcut_changes_no_byte(tmp_path, monkeypatch):
    """The tracker answers a fake tensor's device query itself (two in three of a step's dispatches):
    the step's figures are those of the query passed on to FakeTensorMode."""
    from ampkit.plan.traced import tracker as tracker_module

    desc = desc_of(tmp_path, "qwen3")
    setting = StepSetting(precision="bf16-mixed", micro_batch=2, seq_len=16, checkpointing="full")
    short = trace_hf_step(desc, setting, depth=2).trace()
    monkeypatch.setattr(tracker_module, "_DEVICE", object())  # no query matches: every one dispatched on
    assert trace_hf_step(desc, setting, depth=2).trace() == short
