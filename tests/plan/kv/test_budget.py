"""KV-cache budget: the formula, the pool, and fp16 holding twice fp32's tokens."""

from __future__ import annotations

import pytest

from ampkit.errors import UsageError
from ampkit.plan.config import KvConfig
from ampkit.plan.describe import describe_config, describe_model
from ampkit.plan.kv.budget import activation_reserve_bytes, kv_budget, kv_bytes_per_token, kv_pool_bytes
from ampkit.plan.planner import build_kv
from ampkit.plan.setting import GIB

LLAMA_GQA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
}


@pytest.mark.parametrize("dtype,size", [("fp32", 4), ("fp16", 2), ("bf16", 2), ("fp8", 1)])
def test_bytes_per_token_formula(dtype, size):
    desc = describe_config(LLAMA_GQA)  # Llama-3-8B's shape: 8 KV heads of 128
    assert kv_bytes_per_token(desc, dtype) == 2 * 32 * 8 * 128 * size


def test_pool_and_requests():
    desc = describe_model("7b")
    budget = kv_budget(desc, kv_dtype="fp16", pool_bytes=40 * GIB, context_len=4096)
    per_token = 2 * 32 * 32 * 128 * 2  # 512 KiB: Llama-2-7B has no GQA
    assert budget.bytes_per_token == per_token
    assert budget.max_tokens == 40 * GIB // per_token
    assert budget.max_requests == budget.max_tokens // 4096
    assert kv_pool_bytes(capacity=100, utilization=0.9, weights=30, activation_reserve=10, overhead=5) == 45


@pytest.mark.parametrize("pool", [57 * GIB + 12345, 10**9 + 7, 3 * GIB])
def test_fp16_holds_exactly_twice_fp32(pool):
    desc = describe_config(LLAMA_GQA)
    fp32, fp16 = (kv_budget(desc, kv_dtype=d, pool_bytes=pool, context_len=1024) for d in ("fp32", "fp16"))
    assert fp16.token_capacity == 2 * fp32.token_capacity  # exact: the same pool at half the bytes
    assert fp16.max_tokens in (2 * fp32.max_tokens, 2 * fp32.max_tokens + 1)  # whole tokens round down


def test_build_kv_budget_adds_up():
    summary = build_kv(KvConfig(model="7b", gpu="A100-80GB", weight_dtype="bf16"))
    b = summary["budget"]
    assert b["weights_bytes"] == describe_model("7b").num_parameters() * 2
    spent = b["weights_bytes"] + b["activation_reserve_bytes"] + b["overhead_bytes"]
    assert b["pool_bytes"] == b["usable_bytes"] - spent
    assert b["activation_reserve_bytes"] == activation_reserve_bytes(
        describe_model("7b"), batched_tokens=8192, weight_dtype="bf16"
    )
    by_dtype = {k["kv_dtype"]: k for k in summary["kv"]}
    assert by_dtype["fp8"]["token_capacity"] == 4 * by_dtype["fp32"]["token_capacity"]


def test_kv_config_checks():
    assert KvConfig().gpu == "A100-80GB"  # the seeds' 80 GB card when none is named
    for bad in ({"utilization": 0}, {"context_len": -1}, {"kv_dtypes": "fp32,int4"}, {"weight_dtype": "fp64"}):
        with pytest.raises(UsageError):
            KvConfig(**bad)
