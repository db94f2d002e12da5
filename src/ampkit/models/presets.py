"""Named model shapes, from a ~1M-parameter test model to 70B planning shapes.

`tiny` and `small` are trained on CPU; the rest exist for planning and for GPUs, and are never
instantiated on CPU in tests (a 7B model in fp32 is 28 GB of weights).
"""

from __future__ import annotations

from dataclasses import replace

from ampkit.errors import UsageError
from ampkit.models.config import ModelConfig

PRESETS: dict[str, ModelConfig] = {
    # ~0.9M parameters: tests and the CPU demo (byte vocabulary).
    "tiny": ModelConfig(
        name="tiny", d_model=128, n_layers=4, n_heads=4, d_ff=384, max_seq_len=1024, tie_embeddings=True
    ),
    # ~25M parameters: the measured CPU loop of docs/performance.md (d=512, 8 layers).
    "small": ModelConfig(
        name="small", d_model=512, n_layers=8, n_heads=8, d_ff=1536, max_seq_len=1024, tie_embeddings=True
    ),
    # GPT-2 small's shape (12 x 768, 50257 vocabulary, tied head) in our Llama-style blocks.
    "gpt2-124m": ModelConfig(
        name="gpt2-124m",
        vocab_size=50257,
        d_model=768,
        n_layers=12,
        n_heads=12,
        d_ff=2048,
        max_seq_len=2048,
        tie_embeddings=True,
    ),
    # Llama-3.2-1B's shape.
    "1b": ModelConfig(
        name="1b",
        vocab_size=128256,
        d_model=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        d_ff=8192,
        max_seq_len=4096,
        tie_embeddings=True,
        rope_theta=500000.0,
    ),
    # Llama-2 shapes.
    "7b": ModelConfig(name="7b", vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, d_ff=11008, max_seq_len=4096),
    "13b": ModelConfig(
        name="13b", vocab_size=32000, d_model=5120, n_layers=40, n_heads=40, d_ff=13824, max_seq_len=4096
    ),
    "70b": ModelConfig(
        name="70b", vocab_size=32000, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672, max_seq_len=4096
    ),
}


def get_preset(name: str, **overrides) -> ModelConfig:
    """Look up a preset by name (case-insensitive); `overrides` replace fields (e.g. vocab_size)."""
    key = name.lower()
    if key not in PRESETS:
        known = ", ".join(PRESETS)
        raise UsageError(f"unknown model preset '{name}'; choose one of: {known}")
    config = PRESETS[key]
    return replace(config, **overrides) if overrides else config
