"""The KV cache of the built-in decoder: every layer's keys and values, preallocated, in their own dtype.

Shape per layer: keys and values (B, kv_heads, max_len, head_dim) in `dtype` (the weights' dtype, a
16-bit dtype, or an 8-bit float where the device converts it). Bytes per cached token:

    2 (keys and values) x layers x kv_heads x head_dim x bytes(dtype)

exactly what `ampkit kv` plans with (`ampkit.plan.kv.budget`). Writes cast into the cache's dtype; reads
cast back to the queries' dtype for attention, so an fp8 cache stores 1 byte an element and computes
in the model's dtype (a plain cast, no per-tensor scale: e4m3's max is 448, far above the keys and
values of a normed model, and its 3-bit mantissa is the fidelity cost `bench --inference` measures).
"""

from __future__ import annotations

import torch

from ampkit.models.config import ModelConfig


class KVCache:
    """Keys and values of `layers` layers for `batch_size` sequences of up to `max_len` tokens."""

    def __init__(
        self, cfg: ModelConfig, *, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ):
        shape = (cfg.n_layers, batch_size, cfg.kv_heads, max_len, cfg.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.batch_size, self.max_len, self.dtype = batch_size, max_len, dtype
        self.length = 0
        """tokens cached so far (every sequence of the batch holds the same count)"""

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def bytes_per_token(self) -> int:
        """Cache bytes per cached token of one sequence (every layer's keys and values)."""
        return self.nbytes // (self.batch_size * self.max_len)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        """Store `k`, `v` (B, kv_heads, T, head_dim) at positions start .. start + T - 1."""
        end = start + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} tokens; writing up to position {end}")
        self.keys[layer, :, :, start:end] = k.to(self.dtype)
        self.values[layer, :, :, start:end] = v.to(self.dtype)

    def read(self, layer: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions 0 .. end - 1, in `dtype` (the queries')."""
        return self.keys[layer, :, :, :end].to(dtype), self.values[layer, :, :, :end].to(dtype)
