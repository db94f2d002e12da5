"""Fault specs, injection semantics, the fp32 fix helper and the loss-scale trajectory."""

from __future__ import annotations

import copy

import pytest
import torch

from ampkit.diagnostics import (
    FaultInjector,
    FaultSpec,
    NaiveExpGate,
    ScaleTrajectory,
    corrupt,
    insert_unsafe_op,
    keep_in_fp32,
    parse_fault_spec,
    resolve_module,
)
from ampkit.diagnostics.scale import from_metrics
from ampkit.errors import UsageError
from ampkit.models import build_model, causal_lm_loss, get_preset


@pytest.fixture(scope="module")
def tiny():
    return build_model(get_preset("tiny"), seed=0)


def test_parse_spec_round_trips():
    spec = parse_fault_spec("blocks.0.attn.q_proj:backward:nan@7-9")
    assert spec == FaultSpec(module="blocks.0.attn.q_proj", phase="backward", kind="nan", first_step=7, last_step=9)
    assert str(spec) == "blocks.0.attn.q_proj:backward:nan@7-9"
    assert str(parse_fault_spec("embed:forward:INF@3")) == "embed:forward:inf@3"
    every = parse_fault_spec("lm_head:forward:overflow")
    assert every.first_step is None and every.active(1) and every.active(10**6)
    assert spec.active(7) and spec.active(9) and not spec.active(6) and not spec.active(10)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("blocks.0.mlp", "module_path:phase:kind"),
        ("blocks.0.mlp:forward", "module_path:phase:kind"),
        ("blocks.0.mlp:sideways:nan", "phase 'sideways'"),
        ("blocks.0.mlp:forward:zero", "kind 'zero'"),
        ("blocks.0.mlp:forward:nan@x", "must be a number"),
        ("blocks.0.mlp:forward:nan@5-3", "not a range"),
        ("blocks.0.mlp:forward:nan@0", "not a range"),
    ],
)
def test_bad_specs_are_one_line_usage_errors(text, fragment):
    with pytest.raises(UsageError, match=fragment) as err:
        parse_fault_spec(text)
    assert "\n" not in str(err.value)


def test_unknown_module_lists_close_valid_paths(tiny):
    with pytest.raises(UsageError) as err:
        resolve_module(tiny, "blocks.0.attn.qproj")
    message = str(err.value)
    assert "blocks.0.attn.q_proj" in message and "modules in all" in message
    with pytest.raises(UsageError, match="valid paths include: "):
        resolve_module(tiny, "decoder.layers.9")
    with pytest.raises(UsageError):
        FaultInjector(tiny, "nothing.here:forward:nan")


@pytest.mark.parametrize("kind", ["inf", "nan", "overflow"])
def test_corrupt_kinds(kind):
    x = torch.linspace(-1, 2, 12).reshape(3, 4)
    y = corrupt(x, kind)
    assert y.shape == x.shape and torch.equal(x, torch.linspace(-1, 2, 12).reshape(3, 4))  # input untouched
    if kind == "overflow":
        assert torch.isfinite(y).all() and y.abs().max().item() == pytest.approx(4 * 65504, rel=1e-6)
        assert not torch.isfinite(y.half()).all()
        assert not torch.isfinite(corrupt(x.half(), kind)).all()
    else:
        assert (torch.isinf(y) if kind == "inf" else torch.isnan(y)).sum() == 1
        assert torch.equal(y.flatten()[1:], x.flatten()[1:])


def test_fault_fires_only_in_its_steps_and_never_in_eval(tiny):
    tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    with FaultInjector(tiny, "blocks.1.mlp:forward:nan@2-3") as injector:
        losses = []
        for _ in range(4):
            losses.append(causal_lm_loss(tiny(tokens), tokens).item())
        with torch.no_grad():
            eval_loss = causal_lm_loss(tiny(tokens), tokens).item()
    assert injector.fired == [2, 3]
    assert [torch.isnan(torch.tensor(v)).item() for v in losses] == [False, True, True, False]
    assert eval_loss == eval_loss  # not nan: evaluation passes are never faulted
    assert not tiny._forward_hooks and not tiny._forward_pre_hooks  # detached cleanly


def test_begin_step_replays_a_fault(tiny):
    tokens = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    with FaultInjector(tiny, "norm:forward:inf@5") as injector:
        for step in (4, 5, 5):
            injector.begin_step(step)
            causal_lm_loss(tiny(tokens), tokens)
    assert injector.fired == [5]  # fired at step 5 (twice: the replay fires again)


def test_keep_in_fp32_runs_the_module_in_fp32_and_survives_deepcopy():
    torch.manual_seed(0)
    model = insert_unsafe_op(build_model(get_preset("tiny"), seed=0), "blocks.1.mlp")
    assert isinstance(model.blocks[1].mlp, NaiveExpGate)
    keys = set(model.state_dict())
    seen = {}

    def note_dtype(module, args, out):
        seen.setdefault("dtype", out.dtype)

    model.blocks[1].mlp.score.register_forward_hook(note_dtype)
    keep_in_fp32(model, "blocks.1.mlp", device_type="cpu")
    assert set(model.state_dict()) == keys  # same paths: checkpoints stay loadable
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.float16):
        logits = copy.deepcopy(model)(tokens)
        assert model.blocks[0].mlp.up_proj(torch.ones(1, 128)).dtype == torch.float16  # others stay fp16
    assert seen["dtype"] == torch.float32
    assert torch.isfinite(logits).all()
    assert torch.is_autocast_enabled("cpu") is False  # the region closed


def test_scale_trajectory_events_and_collapse():
    t = ScaleTrajectory()
    t.start(65536.0)
    for step, scale, stepped in [(1, 32768.0, False), (2, 16384.0, False), (3, 16384.0, True), (4, 32768.0, True)]:
        t.record(step, scale, stepped=stepped)
    t.record_collapse(5, 0.5)
    summary = t.summary()
    assert [e["kind"] for e in summary["events"]] == ["backoff", "backoff", "growth", "collapse"]
    assert (summary["skipped"], summary["early_skipped"], summary["min"], summary["collapsed_at"]) == (3, 3, 0.5, 5)
    records = [
        {"event": "train", "step": 1, "loss_scale": 65536.0, "skipped": False},
        {"event": "eval", "step": 1},
        {"event": "train", "step": 2, "loss_scale": 32768.0, "skipped": True},
    ]
    rebuilt = from_metrics(records).summary()
    assert (rebuilt["initial"], rebuilt["backoffs"], rebuilt["skipped"]) == (65536.0, 1, 1)
    assert not from_metrics([{"event": "train", "step": 1, "loss_scale": None}]).active


def test_a_once_fault_fires_on_a_steps_first_pass_only():
    spec = parse_fault_spec("once:1:forward:nan@2")
    assert spec.once and str(spec) == "once:1:forward:nan@2" and not parse_fault_spec("1:forward:nan@2").once
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    x = torch.ones(2, 3)

    def passes(injector: FaultInjector, steps: list[int]) -> list[bool]:
        out = []
        with injector:
            for step in steps:
                injector.begin_step(step)
                out.append(bool(torch.isnan(model(x)).any()))
        return out

    assert passes(FaultInjector(model, spec), [1, 2, 2, 3]) == [False, True, False, False]  # here: once per step
    assert passes(FaultInjector(model, spec, passed_through=5), [1, 2, 3]) == [False, False, False]  # a replay
    assert passes(FaultInjector(model, "1:forward:nan@2", passed_through=5), [2, 2]) == [True, True]
