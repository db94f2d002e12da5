"""Training FLOPs per token: 6N + attention (PaLM, appendix B).

N counts the parameters that take part in matmuls: every block weight plus the output head
(the head multiplies even when it shares the embedding's storage; the embedding *lookup* does
not multiply). Attention adds 12 * layers * d_model * seq_len per token (forward QK^T and AV,
2 * 2 * d * T, times 3 for forward + backward), counted over the full T x T square as PaLM does
(a causal kernel skips about half of it, so this is the usual upper convention).
Units: FLOPs (floating-point operations), not FLOP/s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampkit.models.config import ModelConfig

if TYPE_CHECKING:
    from ampkit.models.hf import HFModelInfo


def matmul_parameters(cfg: ModelConfig | HFModelInfo) -> int:
    head = cfg.vocab_size * cfg.d_model
    non_embedding = cfg.num_parameters(include_embedding=False)
    return non_embedding + (head if cfg.tie_embeddings else 0)


def attention_flops_per_token(cfg: ModelConfig | HFModelInfo, seq_len: int) -> float:
    return 12.0 * cfg.n_layers * cfg.d_model * seq_len


def training_flops_per_token(cfg: ModelConfig | HFModelInfo, seq_len: int) -> float:
    """FLOPs to train on one token (forward + backward) at context length `seq_len`."""
    return 6.0 * matmul_parameters(cfg) + attention_flops_per_token(cfg, seq_len)
