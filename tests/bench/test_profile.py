"""Why it is faster, or not (`ampkit.bench.profile`): the categorisation rules on synthetic profiler
events, and real profiled steps of the language model and the mlp task whose shares sum to 100%."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from ampkit.bench.profile import CATEGORIES, NORM_SCOPE, breakdown, categorize, category_of, profile_step
from ampkit.train import TrainConfig, build_run


@dataclass
class Event:
    name: str
    self_cpu_time_total: float = 0.0
    cpu_parent: object = None
    sequence_nr: int = -1
    self_device_time_total: float = 0.0


def chain(*names: str, seq: int = -1) -> list[Event]:
    """Events nested outermost first; returns the innermost's chain (innermost first)."""
    parent = None
    events = []
    for name in names:
        parent = Event(name, cpu_parent=parent, sequence_nr=seq)
        events.append(parent)
    return list(reversed(events))


@pytest.mark.parametrize(
    "names, expected",
    [
        (("aten::linear", "aten::to", "aten::_to_copy", "aten::copy_"), "casts"),  # autocast's cast inside linear
        (("aten::linear", "aten::addmm"), "matmul"),
        (("aten::_scaled_dot_product_flash_attention_for_cpu_backward",), "matmul"),
        (("aten::convolution_backward",), "matmul"),
        ((NORM_SCOPE, "aten::mul"), "norm"),
        ((NORM_SCOPE, "aten::to", "aten::_to_copy"), "casts"),  # a norm's fp32 upcast is a cast
        (("aten::native_layer_norm_backward",), "norm"),
        (("aten::gelu_backward", "aten::empty_like"), "elementwise"),
        (("aten::cat",), "other"),
        (("autograd::engine::evaluate_function: MmBackward0",), "other"),
        (("ampkit::data", "aten::index", "aten::cat"), "data"),
        (("ampkit::optimizer", "aten::_foreach_norm"), "optimizer"),
        (("Optimizer.step#AdamW.step", "aten::_fused_adamw_"), "optimizer"),
    ],
)
def test_categories_follow_the_rules(names, expected):
    assert category_of(chain(*names), norm_seq=set()) == expected


def test_the_backward_of_a_norm_op_is_normalisation():
    forward = chain(NORM_SCOPE, "aten::mul", seq=7)
    backward = chain("autograd::engine::evaluate_function: MulBackward0", "MulBackward0", "aten::mul", seq=7)
    other = chain("autograd::engine::evaluate_function: MulBackward0", "aten::mul", seq=8)
    events = forward + backward + other
    for event in events:
        event.self_cpu_time_total = 10.0
    times = categorize(events)
    assert times["norm"] == 10.0 * (2 + 3)  # the forward op's scope and itself, the backward's three
    assert times["elementwise"] == 10.0  # the other backward's aten::mul
    assert breakdown(times, wall_s=1e-3)["shares"]["other"] >= 0


def test_breakdown_shares_sum_to_one_and_other_takes_the_rest():
    report = breakdown({"matmul": 600.0, "norm": 100.0, "elementwise": 100.0, "other": 50.0}, wall_s=0.001)
    assert report["step_ms"] == pytest.approx(1.0)
    assert report["ms"]["other"] == pytest.approx(0.2)  # the 50 us of 'other' ops and the 150 us no op covers
    assert sum(report["shares"].values()) == pytest.approx(1.0)
    assert set(report["shares"]) == set(CATEGORIES)


@pytest.mark.parametrize(
    "task, precision",
    [("", "fp32"), ("", "bf16-mixed"), ("", "fp16-mixed"), ("mlp", "fp32"), ("mlp", "bf16-mixed"), ("convnet", "fp32")],
)
def test_a_real_profiled_step_sums_to_100_percent(task, precision):
    objs = build_run(
        TrainConfig.of(
            task=task, model="tiny", precision=precision, steps=10, seq_len=64, batch_size=4, fit_check=False
        )
    )
    with objs.policy.run_context():
        objs.trainer.train_step()
        result, report, peak = profile_step(objs.trainer, device=objs.device)
    assert sum(report["shares"].values()) == pytest.approx(1.0, abs=0.02)
    assert report["shares"]["matmul"] > 0 and report["shares"]["optimizer"] > 0 and peak > 0
    assert sum(report["ms"].values()) == pytest.approx(report["step_ms"], rel=0.02)
    if not task:  # the language model: RMSNorm modules are normalisation (a share that depends on the CPU kind:
        # 0.96% of fp16-mixed's step with AVX2 kernels, where the emulated matmuls take the rest)
        assert report["shares"]["norm"] > 0 and report["ms"]["norm"] > 0
    if precision != "fp32":
        assert report["shares"]["casts"] > 0  # autocast's casts are named
    else:
        assert report["shares"]["casts"] < 0.02
    assert objs.trainer.phases.__class__.__name__ == "NoPhases" and not isinstance(objs.trainer.sampler, type(None))
    assert torch.isfinite(result.loss)
