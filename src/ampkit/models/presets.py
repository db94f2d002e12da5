"""Named model shapes, from a ~1M-parameter test model to 70B planning shapes.

`tiny` and `small` are trained on CPU; the rest exist for planning and for GPUs, and are never
instantiated on CPU in tests (a 7B model in fp32 is 28 GB of weights).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ampkit.errors import UsageError
from ampkit.models.config import ModelConfig

_COLUMNS = (
    "name",
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "d_ff",
    "max_seq_len",
    "tie_embeddings",
)
"""The `ModelConfig` fields of a `PRESETS` row, in order (n_kv_heads None: as many as n_heads)."""


def _preset(*row: Any, **more: Any) -> ModelConfig:
    """One row of `PRESETS`: its columns, then any other field by name (rope_theta)."""
    return ModelConfig(**dict(zip(_COLUMNS, row, strict=True)), **more)


PRESETS: dict[str, ModelConfig] = {
    p.name: p
    for p in (
        # ~0.9M parameters: tests and the CPU demo (byte vocabulary).
        _preset("tiny", 256, 128, 4, 4, None, 384, 1024, True),
        # ~25M parameters: the measured CPU loop of docs/performance.md (d=512, 8 layers).
        _preset("small", 256, 512, 8, 8, None, 1536, 1024, True),
        # GPT-2 small's shape (12 x 768, 50257 vocabulary, tied head) in our Llama-style blocks.
        _preset("gpt2-124m", 50257, 768, 12, 12, None, 2048, 2048, True),
        # Llama-3.2-1B's shape.
        _preset("1b", 128256, 2048, 16, 32, 8, 8192, 4096, True, rope_theta=500000.0),
        # Llama-2 shapes.
        _preset("7b", 32000, 4096, 32, 32, None, 11008, 4096, False),
        _preset("13b", 32000, 5120, 40, 40, None, 13824, 4096, False),
        _preset("70b", 32000, 8192, 80, 64, 8, 28672, 4096, False),
    )
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """Look up a preset by name (case-insensitive); `overrides` replace fields (e.g. vocab_size)."""
    key = name.lower()
    if key not in PRESETS:
        known = ", ".join(PRESETS)
        raise UsageError(f"unknown model preset '{name}'; choose one of: {known}")
    config = PRESETS[key]
    return replace(config, **overrides) if overrides else config
