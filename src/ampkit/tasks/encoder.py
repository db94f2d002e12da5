"""The `encoder` task: a bidirectional transformer encoder classifier on seeded marker sequences
(`synthetic.marker_sequences`: the class is which two marker tokens appear, anywhere)."""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.errors import UsageError
from ampkit.tasks.base import SupervisedTask
from ampkit.tasks.synthetic import check_int, marker_sequences


class EncoderBlock(nn.Module):
    """Pre-norm: x + Attention(LayerNorm(x)), then x + MLP(LayerNorm(x)); attention is non-causal."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(), nn.Linear(mlp_ratio * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        # is_causal=False and no mask: every position attends to every other (bidirectional); all
        # sequences have the same length, so there is no padding to mask. Shapes (B, heads, T, head_dim).
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=False)
        x = x + self.proj(attended.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.norm2(x))


class EncoderClassifier(nn.Module):
    """Token + learned position embeddings, `n_layers` EncoderBlocks, final LayerNorm, mean pool over
    positions, linear head. Input (B, T) int64 tokens with T <= max_len; output (B, classes) logits."""

    def __init__(
        self, *, vocab_size: int, max_len: int, classes: int, d_model: int = 64, n_heads: int = 4, n_layers: int = 2
    ):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(EncoderBlock(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(tokens) + self.pos_emb.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def _encoder_blocks(model: nn.Module) -> list[nn.Module]:
    return list(cast(EncoderClassifier, model).blocks)


def make_encoder_task(
    *, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, vocab_size: int = 32, seq_len: int = 32, **data_args: Any
) -> SupervisedTask:
    """An EncoderClassifier on `marker_sequences`; cross-entropy; one item is one sequence ("samples").
    `data_args`: the data set's other arguments (markers, train_size, held_size, label_noise, data_seed)."""
    check_int("n_heads", n_heads, minimum=1)
    check_int("d_model", d_model, minimum=n_heads)
    check_int("n_layers", n_layers, minimum=1)
    if d_model % n_heads:
        raise UsageError(f"d_model must be a multiple of n_heads, got d_model={d_model}, n_heads={n_heads}")
    data = marker_sequences(vocab_size=vocab_size, seq_len=seq_len, **data_args)

    model = functools.partial(  # picklable: bench's workers rebuild it
        EncoderClassifier,
        vocab_size=vocab_size,
        max_len=seq_len,
        classes=data.classes,
        d_model=d_model,
        n_heads=n_heads,
        n_layers=n_layers,
    )

    return data.classification_task("encoder", model, blocks=_encoder_blocks, seq_len=seq_len, vocab_size=vocab_size)
