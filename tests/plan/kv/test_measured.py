"""`ampkit kv --from-bench`: the budget from measured weights, activations and KV bytes per token."""

from __future__ import annotations

import pytest

from ampkit.errors import UsageError
from ampkit.plan.config import KvConfig
from ampkit.plan.kv.measured import measured_budget, read_bench
from ampkit.plan.setting import GIB

BENCH = {
    "schema": "ampkit.bench-inference/1",
    "model": {"name": "tiny"},
    "config": {"serving": {"infer_batch": 2, "prompt_len": 8}},
    "configurations": [
        {
            "weights": "fp32",
            "kv_dtype": "fp32",
            "weights_bytes": GIB,
            "activation_peak_bytes": 1600,
            "kv_bytes_per_token": 4096,
            "decode_tokens_per_s": 10.0,
            "greedy_agreement": 1.0,
        },
    ],
}


def test_the_pool_is_memory_less_weights_activations_and_overhead():
    config = KvConfig(gpu_mem="10", utilization=0.5, batched_tokens=160, overhead_gib=1.0, context_len=1000)
    [row] = measured_budget(config, BENCH)["measured"]
    activations = 1600 * 160 // 16  # the bench's prefill held 2 x 8 tokens
    assert row["activation_reserve_bytes"] == activations
    assert row["pool_bytes"] == 5 * GIB - GIB - activations - GIB
    assert row["max_tokens"] == row["pool_bytes"] // 4096 and row["max_requests"] == row["max_tokens"] // 1000


def test_a_run_that_is_not_an_inference_bench_is_refused(tmp_path):
    (tmp_path / "summary.json").write_text('{"schema": "ampkit.bench/2"}')
    with pytest.raises(UsageError, match="not an 'ampkit bench --inference' run"):
        read_bench(tmp_path)
    with pytest.raises(UsageError, match="no readable summary.json"):
        read_bench(tmp_path / "missing")
