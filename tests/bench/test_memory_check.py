"""Memory predicted vs measured (`ampkit.bench.memory_check`): the planner's step peak against the
allocator's peak of a real profiled CPU step (acceptance: within 10% for tiny and small under fp32),
a task's traced prediction, and the largest micro-batch the recommendation's command names."""

from __future__ import annotations

import pytest
import torch

from ampkit.bench.config import BenchConfig
from ampkit.bench.memory_check import largest_batch, predict_step_peak
from ampkit.bench.profile import profile_step
from ampkit.bench.worker import train_config_for
from ampkit.tasks.load import build_task
from ampkit.train import build_run


def _measured_step_peak(config: BenchConfig, precision: str) -> tuple[int, int, object]:
    objs = build_run(train_config_for(config, precision))
    with objs.policy.run_context():
        objs.trainer.train_step()  # the optimizer states exist from here on: the steady state
        result, _, peak = profile_step(objs.trainer, device=objs.device)
    return peak, result.n_slots, objs.task


@pytest.mark.parametrize("model, seq_len, batch_size", [("tiny", 256, 8), ("small", 128, 4)])
def test_predicted_step_peak_is_within_10_percent_of_the_measured_one(model, seq_len, batch_size):
    config = BenchConfig.of(model=model, seq_len=seq_len, batch_size=batch_size)
    measured, slots, task = _measured_step_peak(config, "fp32")
    predicted = predict_step_peak(config, task, "fp32", batch_size=batch_size, seq_len=slots // batch_size)
    assert predicted["source"] == "analytic" and predicted["note"] is None
    assert measured == pytest.approx(predicted["bytes"], rel=0.10)


def test_a_tasks_step_is_predicted_by_tracing_it():
    config = BenchConfig.of(task="mlp", batch_size=64, seq_len=256)
    measured, _, task = _measured_step_peak(config, "fp32")
    predicted = predict_step_peak(config, task, "fp32", batch_size=64)
    assert predicted["source"] == "traced" and predicted["bytes"] > 0
    assert measured == pytest.approx(predicted["bytes"], rel=0.25)


def test_an_unpredictable_step_says_why_instead_of_failing():
    class Broken:
        name, unit = "broken", "samples"

        def train_stream(self, *, batch_size, seed):
            raise RuntimeError("no data here")

    found = predict_step_peak(BenchConfig.of(task="x"), Broken(), "fp32", batch_size=2)
    assert found == {"bytes": None, "source": None, "note": "not predicted: no data here"}


def test_the_largest_batch_that_fits_grows_with_the_capacity(monkeypatch):
    import ampkit.bench.memory_check as memory_check
    import ampkit.plan.fit_check as fit_check

    lm = BenchConfig.of(model="tiny", seq_len=256, batch_size=8)
    task = build_task(lm.task_spec())
    mlp_config = BenchConfig.of(task="mlp", batch_size=32, seq_len=256)
    mlp = build_task(mlp_config.task_spec())
    sizes = {}
    for gib in (2, 8):
        for module in (memory_check, fit_check):
            monkeypatch.setattr(module, "_capacity", lambda device, g=gib: (g * 1024**3, "available (test)"))
        sizes[gib] = (
            largest_batch(lm, task, "fp32", device=torch.device("cpu")),
            largest_batch(mlp_config, mlp, "bf16-mixed", device=torch.device("cpu")),
        )
    (lm2, mlp2), (lm8, mlp8) = sizes[2], sizes[8]
    assert lm2["source"] == "analytic" and mlp2["source"] == "traced"
    assert 8 < lm2["batch_size"] < lm8["batch_size"] and 32 < mlp2["batch_size"] < mlp8["batch_size"]
    monkeypatch.setattr(memory_check, "_capacity", lambda device: None)
    assert largest_batch(lm, task, "fp32", device=torch.device("cpu"))["batch_size"] is None


def test_a_lora_bench_names_the_largest_lora_batch(monkeypatch):
    # 7B on an 80 GB card: no full fine-tuning batch fits; the LoRA ledger's does (the recommendation's
    # `ampkit train ... --lora 8 --batch-size N` must be sized as the LoRA run it launches).
    import ampkit.bench.memory_check as memory_check
    import ampkit.plan.fit_check as fit_check
    from ampkit.lora import LoraSettings

    for module in (memory_check, fit_check):
        monkeypatch.setattr(module, "_capacity", lambda device: (80 * 10**9, "free (test)"))
    full = BenchConfig.of(model="7b", seq_len=512, batch_size=8)
    lora = BenchConfig.of(model="7b", seq_len=512, batch_size=8, lora=LoraSettings(lora=8))
    cuda = torch.device("cuda", 0)
    assert largest_batch(full, build_task(full.task_spec()), "bf16-mixed", device=cuda)["batch_size"] == 0
    assert largest_batch(lora, build_task(lora.task_spec()), "bf16-mixed", device=cuda)["batch_size"] >= 8


def test_the_predicted_peak_counts_a_candidates_module_overrides(tmp_path):
    from ampkit.bench.config import BenchConfig
    from ampkit.bench.memory_check import _setting, predict_step_peak
    from ampkit.plan.analytic.ledger import analytic_ledger
    from ampkit.plan.describe import describe_model
    from ampkit.plan.overrides import adjust_weights, kept_parameters, weights_delta
    from ampkit.plan.setting import NO_RESERVE
    from ampkit.precision import ModuleOverrides
    from ampkit.tasks.load import build_task

    config = BenchConfig.of(model="tiny", batch_size=2, seq_len=16)
    task = build_task(config.task_spec())
    plain = predict_step_peak(config, task, "bf16-true", batch_size=2)["bytes"]
    kept = predict_step_peak(config, task, "bf16-true@blocks.*.mlp=fp32", batch_size=2)["bytes"]
    counted = kept_parameters(describe_model("tiny"), ModuleOverrides.keep_fp32("blocks.*.mlp"))
    ledger = analytic_ledger(describe_model("tiny"), _setting("bf16-true", 2, 16), reserve=NO_RESERVE)
    grown = adjust_weights(ledger, counted).tensor_peak - ledger.tensor_peak  # weights, states, gradients
    assert weights_delta(counted, "bf16-true") > 0 and grown > weights_delta(counted, "bf16-true")
    assert kept - plain == grown


def test_a_vlm_candidates_kept_part_is_predicted_in_its_precision(tmp_path):
    pytest.importorskip("transformers")
    from ampkit.bench.config import BenchConfig
    from ampkit.bench.memory_check import predict_step_peak
    from ampkit.tasks.image_text import ImageTextTask
    from vlm_fixtures import save_tiny_vlm

    spec = f"hf:{save_tiny_vlm(tmp_path / 'llava', 'llava')}"
    task = ImageTextTask(model=spec)
    config = BenchConfig.of(model=spec, batch_size=2, seq_len=16)
    plain = predict_step_peak(config, task, "bf16-true", batch_size=2)
    kept = predict_step_peak(config, task, "bf16-true@vision=fp32", batch_size=2)
    shared = predict_step_peak(
        BenchConfig.of(model=spec, batch_size=2, keep_fp32="vision"), task, "bf16-true", batch_size=2
    )
    assert plain["source"] == kept["source"] == "analytic"
    assert kept["bytes"] > plain["bytes"] and shared["bytes"] == kept["bytes"]  # fp32 weights, states, activations
