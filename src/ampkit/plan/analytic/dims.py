"""The only numbers the analytic replays read: a decoder's widths (elements) and the regime's byte sizes."""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.plan.describe import ModelDescription


@dataclass(frozen=True)
class Widths:
    """A decoder's widths in elements, the shape the replays read: model, query and key/value
    projections, MLP, heads, vocabulary."""

    d: int
    q: int
    kv: int
    ff: int
    heads: int
    vocab: int


def widths_of(desc: ModelDescription) -> dict[str, int]:
    """`Widths`' fields from a model description (to build a replay's dims with its byte sizes)."""
    return {
        "d": desc.d_model,
        "q": desc.q_dim,
        "kv": desc.kv_dim,
        "ff": desc.d_ff,
        "heads": desc.n_heads,
        "vocab": desc.vocab_size,
    }


@dataclass(frozen=True)
class Dims(Widths):
    """Model widths and the regime's byte sizes, the only numbers the replay needs."""

    param_bytes: int
    """parameter / residual-stream bytes per element"""
    compute_bytes: int
    """compute (matmul output) bytes per element"""
    auto: bool
    """autocast: each Linear casts (and saves) its own low-precision input"""
