"""ampkit.integrations.lightning: a tiny LightningModule fitted on the CPU with ampkit's callback (Lightning
turns 16-mixed into bf16-mixed on the CPU, so the loss-scale path is test_session.py's)."""

from __future__ import annotations

import json
import warnings

import lightning as L
import pytest
import torch
from torch import nn

from ampkit.integrations import AmpkitWarning
from ampkit.integrations.lightning import AmpkitCallback
from ampkit.summaries import kind_of_summary

STEPS = 4


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        return self.net(batch).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(precision: str, callbacks: list) -> Tiny:
    data = torch.utils.data.DataLoader(torch.randn(64, 8, generator=torch.Generator().manual_seed(1)), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        precision=precision,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    module = Tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lightning's own advice (num_workers, ...)
        warnings.simplefilter("always", AmpkitWarning)  # ampkit's: kept (the first matching filter wins)
        trainer.fit(module, data)
    return module


def test_a_lightning_run_is_watched_without_changing_it(tmp_path):
    callback = AmpkitCallback(out=str(tmp_path / "run"), locator="off", grad_stats_every=2, log_every=2)
    watched, bare = fit("32-true", [callback]), fit("32-true", [])
    for a, b in zip(watched.parameters(), bare.parameters()):
        assert torch.equal(a, b)
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    assert kind_of_summary(summary).validate(summary) == []
    assert summary["framework"]["name"] == "lightning" and summary["precision"] == "fp32"
    assert summary["steps"] == STEPS and summary["model"]["inspected"] and summary["final_loss"] is not None
    records = [json.loads(line) for line in (callback.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "grad_stats"] == [2, 4]
    assert (callback.run_dir / "report.html").is_file()


def test_bf16_mixed_is_warned_about_on_the_kind_that_emulates_it(cpu_kind, tmp_path):
    callback = AmpkitCallback(out=str(tmp_path / "run"), inject="net.0:forward:nan@2", locator="on")
    with warnings.catch_warnings(record=True) as caught:
        fit("bf16-mixed", [callback])
    said = [str(w.message) for w in caught if issubclass(w.category, AmpkitWarning)]
    assert len([s for s in said if "bf16-mixed is emulated on this CPU" in s]) == (1 if cpu_kind == "avx2" else 0)
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    assert summary["precision"] == "bf16-mixed" and summary["warnings"] == said
    first = summary["locator"]["first_nonfinite"]
    assert (first["module"], first["step"]) == ("net.0", 2)


class Failing(Tiny):
    def training_step(self, batch, batch_idx):
        if self.global_step == 2:
            raise RuntimeError("data went away")
        return super().training_step(batch, batch_idx)


def test_an_exception_ends_the_run_as_stopped(tmp_path):
    callback = AmpkitCallback(out=str(tmp_path / "run"))
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        callbacks=[callback],
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=8)
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="data went away"):
        warnings.simplefilter("ignore", UserWarning)
        trainer.fit(Failing(), data)
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and "data went away" in summary["error"] and summary["steps"] == 2
