"""A Llama-style decoder-only language model: RMSNorm, RoPE, SwiGLU, SDPA causal attention.

Numerically sensitive parts compute in fp32 whatever the surrounding precision: RMSNorm statistics,
the RoPE angle tables and rotation, and (in `causal_lm_loss`) the log-softmax. Under autocast the
Linear layers run in the low-precision dtype; under `bf16-true` everything else is bf16.
The attention op is its own module so hooks (doctor, fault injection) can see it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.models.config import ModelConfig
from ampkit.models.init import draw_seed, init_normal_, init_ones_, materialize
from ampkit.models.kv_cache import KVCache
from ampkit.models.loss import chunked_cross_entropy


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32: the mean of squares of bf16/fp16 activations loses precision and
        # can overflow fp16 (|x| > 256 squared exceeds 65504).
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables in fp32 for integer `positions` (..., T) -> (..., T, head_dim // 2).

    Computed per forward rather than stored as buffers, so `module.to(bf16)` can never round the
    angles (at position 4096, bf16 angles are off by up to ~16 radians).
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of the head dim; x is (B, heads, T, hd)."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    x1, x2 = x32[..., :half], x32[..., half:]
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


class ScaledDotProductAttention(nn.Module):
    """The attention op as a module (no parameters), so hooks can watch its inputs and outputs."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        enable_gqa = k.shape[1] != q.shape[1]
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None, enable_gqa=enable_gqa
        )


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.attn = ScaledDotProductAttention()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.attn(q, k, v, attn_mask)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))

    def forward_cached(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, layer: int, start: int
    ) -> torch.Tensor:
        """Inference with a KV cache: the T new tokens at positions start .. start + T - 1 attend to
        every cached token and, causally, to each other (prefill: T > 1; decode: T = 1)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.write(layer, k, v, start)
        keys, values = cache.read(layer, start + T, q.dtype)  # (B, nkv, start + T, hd)
        # New token t (position start + t) may attend to keys 0 .. start + t. A single decode token
        # attends to everything cached: no mask (SDPA's is_causal would align the square top-left).
        mask = None
        if T > 1:
            mask = (
                torch.arange(start + T, device=x.device)[None, :] <= (start + torch.arange(T, device=x.device))[:, None]
            )
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=keys.shape[1] != q.shape[1])
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, attn_mask)
        return x + self.mlp(self.mlp_norm(x))

    def forward_cached(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, layer: int, start: int
    ) -> torch.Tensor:
        x = x + self.attn.forward_cached(self.attn_norm(x), cos, sin, cache, layer, start)
        return x + self.mlp(self.mlp_norm(x))


class LlamaLM(nn.Module):
    """Decoder-only LM. `forward(input_ids (B, T)) -> logits (B, T, vocab)`.

    `positions` (B, T) restart RoPE per packed document; `attn_mask` (B, 1, T, T) bool, True =
    may attend, replaces the causal default (packing passes a block-diagonal causal mask).
    """

    supports_attn_mask = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        if not self.embed.weight.is_meta:  # built on a real device; `build_model` builds on meta, then materialises
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """`init_weights` with a seed drawn from torch's global RNG."""
        self.init_weights(seed=draw_seed())

    def init_weights(self, *, seed: int) -> None:
        """GPT-2 style: N(0, 0.02), residual output projections (o_proj, down_proj) N(0, 0.02 / sqrt(2 *
        layers)) so the residual stream's variance does not grow with depth, norm gains 1.

        Each parameter draws from its own generator seeded by (seed, its name) (`ampkit.models.init`):
        the values do not depend on the dtype (bf16 = the fp32 values rounded), the device, the RNG
        state, or FSDP2 sharding (each rank writes its slice). Re-ties the head to the embedding first:
        `to_empty` gives each module a new tensor of its own. Works on real tensors only (not meta).
        """
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        residual_std = 0.02 / (2 * self.config.n_layers) ** 0.5
        for name, param in self.named_parameters():  # a tied weight once, as "embed.weight"
            if name.endswith("norm.weight"):
                init_ones_(param)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                init_normal_(param, std=residual_std, seed=seed, name=name)
            else:
                init_normal_(param, std=0.02, seed=seed, name=name)

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        _B, T = input_ids.shape
        if positions is None:
            positions = torch.arange(T, device=input_ids.device)
        cos, sin = rope_angles(positions, self.config.head_dim, self.config.rope_theta)
        if cos.dim() == 3:  # per-row positions (B, T, hd/2) -> broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin, attn_mask)
        return self.lm_head(self.norm(x))

    def new_cache(self, *, batch_size: int, max_len: int, dtype: torch.dtype) -> KVCache:
        """An empty KV cache for `batch_size` sequences of up to `max_len` tokens, stored in `dtype`."""
        return KVCache(
            self.config, batch_size=batch_size, max_len=max_len, dtype=dtype, device=self.embed.weight.device
        )

    def forward_cached(self, input_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (B, T, vocab) of `input_ids` (B, T) continuing the `cache.length` cached tokens; the
        new tokens' keys and values join the cache. The training `forward` never touches a cache."""
        start, T = cache.length, input_ids.shape[1]
        if start + T > self.config.max_seq_len:
            raise ValueError(f"{start + T} tokens exceed the model's {self.config.max_seq_len} positions")
        positions = torch.arange(start, start + T, device=input_ids.device)
        cos, sin = rope_angles(positions, self.config.head_dim, self.config.rope_theta)
        x = self.embed(input_ids)
        for layer, block in enumerate(self.blocks):
            assert isinstance(block, Block)  # the ModuleList holds Blocks (typed for mypy)
            x = block.forward_cached(x, cos, sin, cache, layer, start)
        cache.length = start + T
        return self.lm_head(self.norm(x))


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over non-ignored targets, computed in fp32.

    logits (B, T, V) in any dtype; targets (B, T) with IGNORE_INDEX at padding. Row chunks, saving
    the logits rather than fp32 log-probabilities (`ampkit.models.loss`): the values of
    `F.cross_entropy(logits.float(), ...)`, without its (B*T, V) fp32 buffers.
    """
    return chunked_cross_entropy(logits, targets)


def build_model(cfg: ModelConfig, *, device: str | torch.device = "cpu", seed: int | None = None) -> LlamaLM:
    """Build the model on `device`: constructed on the meta device (no memory, no throwaway init), then
    materialised (`to_empty` + `init_weights(seed)`), so each weight is allocated once, in torch's default
    dtype (fp32; bf16 inside a bf16-true policy's `init_context`). With `seed`, the initial weights depend
    only on it (and are the same in every dtype up to rounding); without, a seed is drawn from the global
    RNG."""
    with torch.device("meta"):
        model = LlamaLM(cfg)
    materialize(model, device=device, seed=draw_seed() if seed is None else seed)  # in place
    return model
