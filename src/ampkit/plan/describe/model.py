"""What a planned model is: a shape description with an exact parameter count.

Sources: a built-in preset (`7b`), or a Hugging Face `config.json` on disk for the Llama family
(Llama, Mistral, Qwen2: RMSNorm, RoPE, SwiGLU, grouped-query attention), GPT-2 (LayerNorm with
bias, learned positions, fused-QKV with biases, GELU MLP, tied head) and OPT (LayerNorm, learned
positions offset by 2, biased q/k/v/out, ReLU MLP, tied head). `transformers` is not needed: the
counts are formulas over the config fields, written so the HF adapter can check them against
`transformers`' own modules later (`describe_config(dict)` takes the parsed JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ampkit.errors import UsageError
from ampkit.models import ModelConfig
from ampkit.plan.describe.family import BlockFamily, block_family

FAMILIES = ("llama", "gpt2", "opt")
_LLAMA_TYPES = {"llama", "mistral", "qwen2"}


@dataclass(frozen=True, kw_only=True)
class ModelDescription:
    """A decoder-only transformer's shape, enough to count parameters, FLOPs and memory."""

    name: str
    """preset name or the config file's path"""
    family: str
    """"llama" (RMSNorm, RoPE, SwiGLU; ampkit's own model), "gpt2" or "opt" (LayerNorm, learned positions)"""
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    """key/value heads (equal to n_heads without grouped-query attention)"""
    head_dim: int
    d_ff: int
    """MLP hidden size"""
    tie_embeddings: bool
    """the output head shares the input embedding's weight"""
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    """LayerNorm has a bias (gpt2/opt); RMSNorm has none"""
    position_rows: int = 0
    """rows of a learned position-embedding table (0 with RoPE); OPT's table has 2 extra rows"""
    max_positions: int = 0
    """longest sequence the model supports (0 = no hard limit: RoPE)"""
    dropout: float = 0.0
    """residual dropout probability in training (a 1-byte mask per dropped element when > 0)"""
    source: str = "preset"
    """"preset" or "config.json" """
    model_config: ModelConfig | None = field(default=None, compare=False)
    """the ampkit ModelConfig when ampkit can build this model (traced engine), else None"""

    @property
    def block(self) -> BlockFamily:
        """What this family's blocks are made of (the object the formulas and the ledger read)."""
        return block_family(self.family)

    @property
    def buildable(self) -> bool:
        return self.model_config is not None

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def block_parameters(self) -> int:
        """Parameters of one transformer block."""
        d, q, kv, ff = self.d_model, self.q_dim, self.kv_dim, self.d_ff
        attn = d * q + 2 * d * kv + q * d
        attn += (q + 2 * kv) * self.qkv_bias + d * self.out_bias
        mlp_mats = self.block.mlp_matrices  # SwiGLU: gate, up, down; else fc_in, fc_out
        mlp = mlp_mats * d * ff + (ff * (mlp_mats - 1) + d) * self.mlp_bias
        norms = 2 * d * (2 if self.norm_bias else 1)
        return attn + mlp + norms

    def layers_parameters(self) -> int:
        """Parameters of all the repeated blocks together (FSDP2's per-block units; the rest is the root's)."""
        return self.n_layers * self.block_parameters()

    def matmul_weights_per_block(self) -> list[int]:
        """Element counts of the block's matmul weights, in forward order (q, k, v, o, mlp...)."""
        d, q, kv, ff = self.d_model, self.q_dim, self.kv_dim, self.d_ff
        mlp = [d * ff] * (self.block.mlp_matrices - 1) + [ff * d]  # (gate,) up or fc_in, then down or fc_out
        return [d * q, d * kv, d * kv, q * d, *mlp]

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.d_model + self.position_rows * self.d_model

    def head_parameters(self) -> int:
        """Parameters the output head adds (0 when tied to the embedding)."""
        return 0 if self.tie_embeddings else self.vocab_size * self.d_model

    def final_norm_parameters(self) -> int:
        return self.d_model * (2 if self.norm_bias else 1)

    def num_parameters(self) -> int:
        """Exact count of distinct parameters (a tied head counted once)."""
        return (
            self.embedding_parameters()
            + self.n_layers * self.block_parameters()
            + self.final_norm_parameters()
            + self.head_parameters()
        )

    def matmul_parameters(self) -> int:
        """Parameters that multiply in a forward pass: every block weight plus the head (which
        multiplies even when tied); embedding and position lookups do not. The N of 6N."""
        return self.n_layers * self.block_parameters() + self.final_norm_parameters() + self.vocab_size * self.d_model

    def parameter_tensors(self) -> list[int]:
        """Element count of every distinct parameter tensor (for per-tensor optimizer rules)."""
        d = self.d_model
        block = list(self.matmul_weights_per_block())
        qkv_biases = [self.q_dim, self.kv_dim, self.kv_dim]
        if self.block.fused_qkv:  # one fused c_attn weight (d, 3d) and bias (3d)
            block = [sum(block[:3]), *block[3:]]
            qkv_biases = [sum(qkv_biases)]
        if self.qkv_bias:
            block += qkv_biases
        if self.out_bias:
            block.append(d)
        if self.mlp_bias:
            block += [self.d_ff] * (self.block.mlp_matrices - 1) + [d]
        block += [d, d] * (2 if self.norm_bias else 1)
        tensors = [self.vocab_size * d] + block * self.n_layers
        tensors += [d] * (2 if self.norm_bias else 1)
        if self.position_rows:
            tensors.append(self.position_rows * d)
        if not self.tie_embeddings:
            tensors.append(self.vocab_size * d)
        return tensors

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model_config"}
        out.update(
            num_parameters=self.num_parameters(), matmul_parameters=self.matmul_parameters(), buildable=self.buildable
        )
        return out


_SHARED_SHAPE = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "tie_embeddings")
"""The shape fields a ModelConfig and a ModelDescription both have, with the same meaning (not
n_kv_heads: a ModelConfig's None means as many as n_heads)."""


def _shared_shape(shape: ModelConfig | ModelDescription) -> dict[str, Any]:
    return {name: getattr(shape, name) for name in _SHARED_SHAPE}


def from_model_config(cfg: ModelConfig, *, source: str = "preset") -> ModelDescription:
    """Describe an ampkit Llama-style ModelConfig (buildable, so the traced engine applies)."""
    return ModelDescription(
        name=cfg.name,
        family="llama",
        **_shared_shape(cfg),
        n_kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        source=source,
        model_config=cfg,
    )


def describe_config(
    data: dict[str, Any], *, name: str = "config.json", vocab_size: int | None = None
) -> ModelDescription:
    """Describe a parsed Hugging Face config (model_type llama, mistral, qwen2, gpt2 or opt)."""
    model_type = str(data.get("model_type", "")).lower()
    if model_type in _LLAMA_TYPES:
        desc = _llama_family(data, name, model_type)
    elif model_type == "gpt2":
        desc = _gpt2(data, name)
    elif model_type == "opt":
        desc = _opt(data, name)
    else:
        shown = repr(data["model_type"]) if "model_type" in data else "missing"
        raise UsageError(
            f"{name}: model_type {shown} is not supported; ampkit plans llama, mistral, qwen2, "
            "gpt2 and opt configs (or use a preset)"
        )
    if vocab_size is not None:
        desc = replace(desc, vocab_size=vocab_size, model_config=None)
    return desc


def _require(data: dict[str, Any], keys: tuple[str, ...], name: str, model_type: str) -> None:
    missing = [k for k in keys if k not in data]
    if missing:
        raise UsageError(f"{name}: {model_type} config is missing required field(s): {', '.join(missing)}")
    for key in keys:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UsageError(f"{name}: field {key} must be a positive integer, got {value!r}")


def _heads(n_heads: int, n_kv: int, d: int, head_dim: int, name: str) -> None:
    if n_kv <= 0 or n_heads % n_kv:
        raise UsageError(f"{name}: num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv}")
    if head_dim <= 0:
        raise UsageError(f"{name}: head dimension must be positive (hidden_size {d}, heads {n_heads})")


def _llama_family(data: dict[str, Any], name: str, model_type: str) -> ModelDescription:
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    _require(data, keys, name, model_type)
    d, heads = data["hidden_size"], data["num_attention_heads"]
    n_kv = data.get("num_key_value_heads") or heads
    head_dim = data.get("head_dim") or d // heads
    _heads(heads, n_kv, d, head_dim, name)
    qkv_bias = model_type == "qwen2" or bool(data.get("attention_bias", False))
    out_bias = model_type != "qwen2" and bool(data.get("attention_bias", False))
    desc = ModelDescription(
        name=name,
        family="llama",
        vocab_size=data["vocab_size"],
        d_model=d,
        n_layers=data["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_ff=data["intermediate_size"],
        tie_embeddings=bool(data.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        mlp_bias=bool(data.get("mlp_bias", False)),
        source="config.json",
    )
    return _with_model_config(desc, data)


def _with_model_config(desc: ModelDescription, data: dict[str, Any]) -> ModelDescription:
    """Attach an ampkit ModelConfig when ampkit's own model has exactly this shape (no biases)."""
    plain = not (desc.qkv_bias or desc.out_bias or desc.mlp_bias) and desc.head_dim * desc.n_heads == desc.d_model
    if not plain or desc.head_dim % 2:
        return desc
    cfg = ModelConfig(
        name=Path(desc.name).parent.name or desc.name,
        **_shared_shape(desc),
        n_kv_heads=desc.n_kv_heads,
        max_seq_len=int(data.get("max_position_embeddings", 2048)),
        norm_eps=float(data.get("rms_norm_eps", 1e-5)),
        rope_theta=float(data.get("rope_theta", 10000.0)),
    )
    return replace(desc, model_config=cfg)


def _gpt2(data: dict[str, Any], name: str) -> ModelDescription:
    _require(data, ("n_embd", "n_layer", "n_head", "vocab_size", "n_positions"), name, "gpt2")
    d, heads = data["n_embd"], data["n_head"]
    if d % heads:
        raise UsageError(f"{name}: n_embd {d} is not divisible by n_head {heads}")
    _heads(heads, heads, d, d // heads, name)
    return _layernorm_family(
        data,
        name,
        "gpt2",
        d=d,
        heads=heads,
        n_layers=data["n_layer"],
        d_ff=data.get("n_inner") or 4 * d,
        bias=True,
        max_positions=data["n_positions"],
        position_rows=data["n_positions"],
        dropout_key="resid_pdrop",
    )


def _opt(data: dict[str, Any], name: str) -> ModelDescription:
    keys = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "ffn_dim",
        "vocab_size",
        "max_position_embeddings",
    )
    _require(data, keys, name, "opt")
    d, heads = data["hidden_size"], data["num_attention_heads"]
    proj = data.get("word_embed_proj_dim", d)
    if proj != d:
        raise UsageError(
            f"{name}: OPT with word_embed_proj_dim {proj} != hidden_size {d} (project_in/out, "
            "as in opt-350m) is not supported; plan another OPT size"
        )
    if not data.get("do_layer_norm_before", True):
        raise UsageError(
            f"{name}: post-LayerNorm OPT (do_layer_norm_before false, as in opt-350m) is not "
            "supported; plan another OPT size"
        )
    if d % heads:
        raise UsageError(f"{name}: hidden_size {d} is not divisible by num_attention_heads {heads}")
    bias = bool(data.get("enable_bias", True))
    norm_bias = bool(data.get("layer_norm_elementwise_affine", True))
    if not norm_bias:
        raise UsageError(f"{name}: OPT without LayerNorm affine parameters is not supported")
    return _layernorm_family(
        data,
        name,
        "opt",
        d=d,
        heads=heads,
        n_layers=data["num_hidden_layers"],
        d_ff=data["ffn_dim"],
        bias=bias,
        max_positions=data["max_position_embeddings"],
        position_rows=data["max_position_embeddings"] + 2,  # OPT's learned positions start at 2
        dropout_key="dropout",
    )


def _layernorm_family(
    data: dict[str, Any],
    name: str,
    family: str,
    *,
    d: int,
    heads: int,
    n_layers: int,
    d_ff: int,
    bias: bool,
    max_positions: int,
    position_rows: int,
    dropout_key: str,
) -> ModelDescription:
    """GPT-2 and OPT: multi-head attention (no grouped queries), LayerNorm with bias, learned positions,
    a head tied by default; `bias` is that of q/k/v, the attention output and the MLP."""
    return ModelDescription(
        name=name,
        family=family,
        vocab_size=data["vocab_size"],
        d_model=d,
        n_layers=n_layers,
        n_heads=heads,
        n_kv_heads=heads,
        head_dim=d // heads,
        d_ff=d_ff,
        tie_embeddings=bool(data.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=bias,
        norm_bias=True,
        position_rows=position_rows,
        max_positions=max_positions,
        dropout=float(data.get(dropout_key, 0.0) or 0.0),
        source="config.json",
    )
