"""`ampkit bench --lora RANK`: every precision on the LoRA workload (the base stored as each precision
implies, fp32 adapters), fidelity compared on the adapters' gradients; fp8 (which swaps the Linear
layers LoRA adapts) refused before any worker starts."""

from __future__ import annotations

import json

import pytest

from ampkit.bench.config import BenchConfig, resolve_for_device
from ampkit.errors import UsageError
from ampkit.hardware import describe_device, pick_device
from ampkit.lora import LoraSettings

pytest.importorskip("peft")


@pytest.mark.slow
def test_bench_compares_precisions_on_the_adapters(real_runs):
    """The shared `bench --lora 4 --precisions fp32,bf16-mixed` run on tiny shapes (tests/helpers.py)."""
    summary = json.loads((real_runs["bench-lora"].run_dir / "summary.json").read_text())
    assert summary["config"]["lora"]["lora"] == 4
    results = {r["name"]: r for r in summary["precisions"]}
    assert set(results) == {"fp32", "bf16-mixed"} and all(r["status"] == "ok" for r in results.values())
    trainable = 4 * (4 * 4 * (128 + 128) + 3 * 4 * (128 + 384))  # layers x rank x (in + out) per adapted Linear
    assert results["bf16-mixed"]["fidelity"]["grad_elements"] == trainable == 40_960
    assert results["bf16-mixed"]["fidelity"]["grad_cosine"] > 0.99


def test_fp8_is_refused_and_dropped_from_the_defaults():
    info = describe_device(pick_device("cpu"))
    with pytest.raises(UsageError, match="fp8-emulated swaps the Linear layers LoRA adapts"):
        resolve_for_device(BenchConfig(precisions="fp8-emulated", lora=LoraSettings(lora=4)), info)
    _, names, _ = resolve_for_device(BenchConfig(lora=LoraSettings(lora=4)), info)
    assert "fp32" in names and not any(n.startswith("fp8") for n in names)
