"""ampkit.integrations.session: the monitor both callbacks drive, here from a plain torch loop (fp16
autocast and torch's own GradScaler on the CPU), so its loss-scale path runs without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.integrations import AmpkitWarning, Monitor, MonitorSettings, Subject
from ampkit.integrations.session import uninspectable
from ampkit.summaries import kind_of_summary


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _train(monitor: Monitor, model: nn.Module, *, steps: int) -> torch.optim.Optimizer:
    """fp16 autocast + GradScaler on the CPU, driven through the monitor as a framework would."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    subject = Subject(
        model=model,
        optimizer=optimizer,
        precision="fp16-mixed",
        device="cpu",
        framework="lightning",
        framework_version="test",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmpkitWarning)  # an emulated fp16: not what these tests check
        monitor.begin(subject, scaler_fn=lambda: scaler)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    for step in range(1, steps + 1):
        monitor.begin_step(step)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        monitor.end_step(step)
        monitor.log(step, loss=loss)
    return optimizer


def test_an_auto_locator_arms_after_the_first_skipped_step_and_names_the_module(tmp_path):
    """The fault makes step 2's gradients inf: the scaler skips it (weights untouched), the locator is
    armed, and step 3's fault is found where it is injected."""
    monitor = Monitor(MonitorSettings(out=str(tmp_path / "run"), locator="auto", inject="0:forward:inf@2-3"))
    _train(monitor, _model(), steps=4)
    summary = monitor.end()
    assert summary is not None and summary["locator"]["armed_at"] == 2
    first = summary["locator"]["first_nonfinite"]
    assert (first["module"], first["phase"], first["step"]) == ("0", "forward", 3)
    assert summary["skipped_steps"] == 2 and summary["inject"]["fired_steps"] == [2, 3]
    points = summary["scale"]["points"]
    assert [p["scale"] for p in points if p["skipped"]] == [2.0**9, 2.0**8]  # each skip halves the scale
    assert kind_of_summary(summary).validate(summary) == []
    events = [json.loads(line)["event"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert events.index("locator_armed") < events.index("nonfinite")


def test_with_the_locator_off_nothing_is_armed(tmp_path):
    monitor = Monitor(MonitorSettings(out=str(tmp_path / "run"), locator="off", inject="0:forward:inf@2"))
    _train(monitor, _model(), steps=3)
    summary = monitor.end()
    assert summary["locator"] == {"armed_at": None, "first_nonfinite": None, "near_limits": []}
    assert summary["skipped_steps"] == 1


def test_a_precision_the_device_cannot_run_is_refused_before_anything_is_written(tmp_path):
    monitor = Monitor(MonitorSettings(out=str(tmp_path / "run")))
    subject = Subject(
        model=_model(), optimizer=None, precision="tf32", device="cpu", framework="x", framework_version="0"
    )
    with pytest.raises(UsageError, match="tf32 needs"):
        monitor.begin(subject)
    assert not (tmp_path / "run").exists()


def test_a_fault_naming_no_module_leaves_no_hook_behind(tmp_path):
    model = _model()
    monitor = Monitor(MonitorSettings(out=str(tmp_path / "run"), locator="on", inject="nope:forward:nan"))
    subject = Subject(model=model, optimizer=None, precision="fp32", device="cpu", framework="x", framework_version="0")
    with pytest.raises(UsageError, match="nope"):
        monitor.begin(subject)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


class _Scripted(nn.Module):
    """An unusual wrapper: its inner module is a ScriptModule, which refuses forward hooks."""

    def __init__(self):
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated, still shipped
            self.inner = torch.jit.script(nn.Linear(8, 1))

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: lambda x: x, "not a torch.nn.Module"),
        (nn.ReLU, "no trainable floating-point parameters"),
        (_Scripted, "hooks were refused"),
    ],
)
def test_a_model_ampkit_cannot_inspect_is_said_once_and_the_run_goes_on(tmp_path, make, says):
    model = make()
    monitor = Monitor(MonitorSettings(out=str(tmp_path / "run"), locator="on", grad_stats_every=1))
    subject = Subject(model=model, optimizer=None, precision="fp32", device="cpu", framework="x", framework_version="0")
    with pytest.warns(AmpkitWarning, match=says):
        monitor.begin(subject)
    monitor.begin_step(1)
    monitor.end_step(1)
    monitor.log(1, loss=1.5)
    summary = monitor.end()
    assert summary["model"]["inspected"] is False and summary["steps"] == 1 and summary["final_loss"] == 1.5
    assert (tmp_path / "run" / "report.html").is_file()
    if isinstance(model, _Scripted):  # the hooks placed before the refusal were removed again
        assert not model._forward_pre_hooks and not model._forward_hooks
    assert uninspectable(_model()) is None


@pytest.mark.parametrize(
    ("settings", "message"), [({"locator": "sometimes"}, "locator="), ({"log_every": 0}, "log_every")]
)
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(UsageError, match=message):
        MonitorSettings(**settings)


def test_ampkit_and_the_monitor_import_without_transformers_or_lightning():
    """Each framework is imported by its own callback module only (`ampkit report` of a callback's run too)."""
    code = (
        "import sys, ampkit, ampkit.integrations, ampkit.integrations.report, ampkit.cli.report; "
        "print(sorted({'transformers', 'lightning', 'peft'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.strip() == "[]"
