"""Model shapes: one typed config for the built-in Llama-style decoder, with its exact parameter count."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ampkit.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of a Llama-style decoder-only LM (RMSNorm, RoPE, SwiGLU, grouped-query attention)."""

    name: str = field(default="custom", metadata={"help": "preset name or a label for the shape"})
    vocab_size: int = field(default=256, metadata={"help": "vocabulary size (256 for the byte tokenizer)"})
    d_model: int = field(metadata={"help": "hidden size"})
    n_layers: int = field(metadata={"help": "number of transformer blocks"})
    n_heads: int = field(metadata={"help": "attention (query) heads"})
    n_kv_heads: int | None = field(default=None, metadata={"help": "key/value heads (GQA); None = n_heads"})
    d_ff: int = field(metadata={"help": "SwiGLU hidden size"})
    max_seq_len: int = field(default=2048, metadata={"help": "longest sequence the RoPE table covers"})
    tie_embeddings: bool = field(default=False, metadata={"help": "share the input embedding and output head"})
    norm_eps: float = field(default=1e-5, metadata={"help": "RMSNorm epsilon"})
    rope_theta: float = field(default=10000.0, metadata={"help": "RoPE base frequency"})

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise UsageError(f"model {name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise UsageError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.head_dim % 2:
            raise UsageError(f"head dim {self.head_dim} must be even for RoPE")
        if self.kv_heads <= 0 or self.n_heads % self.kv_heads:
            raise UsageError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    def num_parameters(self, *, include_embedding: bool = True) -> int:
        """Exact parameter count of `LlamaLM(self)`, from the shape alone."""
        d, hd = self.d_model, self.head_dim
        attn = d * (self.n_heads * hd) + 2 * d * (self.kv_heads * hd) + (self.n_heads * hd) * d
        mlp = 3 * d * self.d_ff
        norms = 2 * d
        per_block = attn + mlp + norms
        embedding = self.vocab_size * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        total = self.n_layers * per_block + d + head  # + final norm
        return total + embedding if include_embedding else total

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
