"""KV-cache budget for serving: bytes per token, the pool, how many tokens and requests fit.

bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes(KV dtype).
pool = GPU memory x utilization - weights - activation reserve - non-torch overhead (vLLM's way:
it profiles one forward at its largest batched-token count for the activation peak; here that
peak is estimated, or given with --activation-reserve).
max tokens = floor(pool / bytes per token); max requests at a context = floor(max tokens / context).
The pool's exact token capacity (a real number) scales with 1/bytes, so an fp16 cache holds
exactly twice the tokens of an fp32 one; the whole-token floor can differ from 2x by one token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ampkit.errors import UsageError
from ampkit.formats import get_format
from ampkit.plan.describe import ModelDescription
from ampkit.plan.numerics import FP32_BYTES as F
from ampkit.plan.setting import GIB
from ampkit.records import Record

KV_DTYPES = ("fp32", "fp16", "bf16", "fp8")
"""the KV-cache and weight formats a budget compares (`ampkit.formats`: fp8 is e4m3)"""
WEIGHT_DTYPES = KV_DTYPES
LOGIT_ROWS = 256
"""sequences whose last-position logits (fp32) one serving forward computes at most (vLLM's default
max_num_seqs)"""


def check_dtype(name: str, names: tuple[str, ...], flag: str) -> str:
    key = name.strip().lower()
    if key not in names:
        raise UsageError(f"unknown {flag} {name!r}; choose from: {', '.join(names)}")
    return key


def dtype_bytes(name: str, names: tuple[str, ...], flag: str) -> int:
    """Bytes of one element of the format `name`, one of `names` (a flag's choices)."""
    return get_format(check_dtype(name, names, flag)).element_bytes


def kv_bytes_per_token(desc: ModelDescription, kv_dtype: str) -> int:
    """K and V for one token across all layers."""
    size = dtype_bytes(kv_dtype, KV_DTYPES, "--kv-dtypes")
    return 2 * desc.n_layers * desc.n_kv_heads * desc.head_dim * size


def weight_bytes(desc: ModelDescription, weight_dtype: str) -> int:
    return desc.num_parameters() * dtype_bytes(weight_dtype, WEIGHT_DTYPES, "--weight-dtype")


def activation_reserve_bytes(desc: ModelDescription, *, batched_tokens: int, weight_dtype: str) -> int:
    """Estimated peak of one serving forward over `batched_tokens` tokens: the widest layer's
    intermediates (q, k, v, attention output, the MLP's two hidden tensors, the residual and its
    norm) in the weight dtype, plus fp32 logits for up to LOGIT_ROWS sequences."""
    b = dtype_bytes(weight_dtype, WEIGHT_DTYPES, "--weight-dtype")
    per_token = (2 * desc.q_dim + 2 * desc.kv_dim + 2 * desc.d_ff + 2 * desc.d_model) * b
    return batched_tokens * per_token + min(batched_tokens, LOGIT_ROWS) * desc.vocab_size * F


@dataclass(frozen=True, kw_only=True)
class KvBudget(Record):
    """One KV dtype's budget."""

    kv_dtype: str
    bytes_per_token: int
    pool_bytes: int
    token_capacity: float
    """pool / bytes per token, exactly"""
    max_tokens: int
    max_requests: int
    """concurrent requests of `context_len` tokens each"""
    context_len: int


class BudgetSettings(Protocol):
    """The serving flags a pool budget reads (`ampkit.plan.config.KvConfig` has them; a Protocol so
    this layer does not import the config that imports it)."""

    @property
    def weight_dtype(self) -> str: ...
    @property
    def utilization(self) -> float: ...
    @property
    def activation_reserve_gib(self) -> float | None: ...
    @property
    def batched_tokens(self) -> int: ...
    @property
    def overhead_gib(self) -> float: ...


def kv_pool_bytes(*, capacity: int, utilization: float, weights: int, activation_reserve: int, overhead: int) -> int:
    return int(capacity * utilization) - weights - activation_reserve - overhead


def pool_budget(desc: ModelDescription, config: BudgetSettings, *, capacity: int) -> dict[str, int | float]:
    """kv's `budget` block: of `capacity` bytes, the usable share (--utilization) less the weights in
    --weight-dtype, the activation reserve (--activation-reserve-gib, else the estimate for
    --batched-tokens) and --overhead-gib; what is left is the KV pool (`pool_bytes`, may be < 0).
    Bytes; the flags' GiB are 1024**3 bytes."""
    weights = weight_bytes(desc, config.weight_dtype)
    if config.activation_reserve_gib is not None:
        reserve = int(config.activation_reserve_gib * GIB)
    else:
        reserve = activation_reserve_bytes(desc, batched_tokens=config.batched_tokens, weight_dtype=config.weight_dtype)
    overhead = int(config.overhead_gib * GIB)
    return {
        "capacity_bytes": capacity,
        "utilization": config.utilization,
        "usable_bytes": int(capacity * config.utilization),
        "weights_bytes": weights,
        "activation_reserve_bytes": reserve,
        "overhead_bytes": overhead,
        "pool_bytes": kv_pool_bytes(
            capacity=capacity,
            utilization=config.utilization,
            weights=weights,
            activation_reserve=reserve,
            overhead=overhead,
        ),
    }


def kv_budget(desc: ModelDescription, *, kv_dtype: str, pool_bytes: int, context_len: int) -> KvBudget:
    per_token = kv_bytes_per_token(desc, kv_dtype)
    pool = max(0, pool_bytes)
    max_tokens = pool // per_token
    return KvBudget(
        kv_dtype=kv_dtype,
        bytes_per_token=per_token,
        pool_bytes=pool_bytes,
        token_capacity=pool / per_token,
        max_tokens=max_tokens,
        max_requests=max_tokens // context_len,
        context_len=context_len,
    )
