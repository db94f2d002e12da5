"""The model's GEMMs: each Linear of a decoder block (in every block alike) and the output head, and the
three GEMMs each runs per training step for M tokens (M = micro-batch x sequence).

    forward  (M x K) @ (K x N)    dgrad  (M x N) @ (N x K)    wgrad  (N x M) @ (M x K)

Names are the modules' own (`q_proj`, `down_proj`, the head `lm_head`): what a torchao filter matches
against a module's fully qualified name. A block family whose Linears torchao does not convert (GPT-2's
Conv1D) has none here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.plan.describe import ModelDescription

HEAD = "lm_head"
"""The output head's module name (ampkit's model and transformers' causal LMs): kept in bf16 by every
converter ampkit drives, and by the NVFP4 recipe (its sensitive last layer)."""
PASSES = ("forward", "dgrad", "wgrad")


@dataclass(frozen=True, kw_only=True)
class LinearShape:
    """One Linear kind: in_features K, out_features N, and how many of it the model has."""

    name: str
    k: int
    n: int
    count: int
    """n_layers for a block's Linear, 1 for the head"""
    head: bool = False

    def gemms(self, tokens: int) -> list[tuple[str, int, int, int]]:
        """(pass, m, k, n) of its forward, dgrad and wgrad GEMMs fed `tokens` rows."""
        m, k, n = tokens, self.k, self.n
        return [("forward", m, k, n), ("dgrad", m, n, k), ("wgrad", n, m, k)]

    def to_dict(self, tokens: int) -> dict:
        return {
            "name": self.name,
            "k": self.k,
            "n": self.n,
            "count": self.count,
            "head": self.head,
            "gemms": [{"pass": p, "m": m, "k": k, "n": n} for p, m, k, n in self.gemms(tokens)],
        }


def model_linears(desc: ModelDescription) -> list[LinearShape]:
    """A block's Linears (each `n_layers` times), then the head; [] where the family's blocks hold no
    Linear a converter swaps (GPT-2's Conv1D)."""
    block = desc.block.linears(d=desc.d_model, q=desc.q_dim, kv=desc.kv_dim, ff=desc.d_ff)
    if not block:
        return []
    shapes = [LinearShape(name=name, k=k, n=n, count=desc.n_layers) for name, k, n in block]
    return [*shapes, LinearShape(name=HEAD, k=desc.d_model, n=desc.vocab_size, count=1, head=True)]
