"""One object per block family: what a family's decoder blocks are made of.

The formulas (`model.py`), the analytic ledger's scripts (`analytic/blocks.py`), the fp8 estimate and
`plan --lora` read these facts instead of testing the family's name; a new family is a new object.
`ModelDescription.family` stays the name (summaries store it); `ModelDescription.block` is the object.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class BlockFamily:
    """A decoder block's make-up, as the planner's formulas and scripts need it."""

    name: str
    """the family's name (`ModelDescription.family`); "" for an architecture without formulas"""
    script: str
    """the analytic ledger's block script (`analytic.blocks.SCRIPTS`): "llama" (RMSNorm, RoPE, SwiGLU)
    or "gpt" (LayerNorm, learned positions, ungated MLP)"""
    rope: bool
    """rotary positions: fp32 cos and sin tables in the forward (else a learned position table)"""
    gated_mlp: bool
    """SwiGLU: gate, up and down matrices (else fc_in and fc_out)"""
    fused_qkv: bool
    """one fused q/k/v weight and bias (GPT-2's c_attn Conv1D) instead of three projections"""
    fp8_linears: tuple[tuple[str, str, str], ...]
    """(name, in width, out width) of the block's Linears torchao's float8 converts, widths named as
    `Widths` names them (d, q, kv, ff); () for a block of Conv1D layers (GPT-2), which it converts none of"""
    lora_targets: bool
    """`plan --lora` knows its projections' names (Llama-shaped models only)"""

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def linears(self, **widths: int) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of the block's fp8-convertible Linears at `widths`."""
        return [(name, widths[i], widths[o]) for name, i, o in self.fp8_linears]


_LLAMA_LINEARS = (
    ("q_proj", "d", "q"),
    ("k_proj", "d", "kv"),
    ("v_proj", "d", "kv"),
    ("o_proj", "q", "d"),
    ("gate_proj", "d", "ff"),
    ("up_proj", "d", "ff"),
    ("down_proj", "ff", "d"),
)

LLAMA = BlockFamily(
    name="llama",
    script="llama",
    rope=True,
    gated_mlp=True,
    fused_qkv=False,
    fp8_linears=_LLAMA_LINEARS,
    lora_targets=True,
)
"""ampkit's own decoder and HF llama, mistral, qwen2: RMSNorm, RoPE, SwiGLU, grouped-query attention."""
GPT2 = BlockFamily(
    name="gpt2", script="gpt", rope=False, gated_mlp=False, fused_qkv=True, fp8_linears=(), lora_targets=False
)
"""LayerNorm with bias, learned positions, fused c_attn (Conv1D), GELU MLP."""
OPT = BlockFamily(
    name="opt",
    script="gpt",
    rope=False,
    gated_mlp=False,
    fused_qkv=False,
    fp8_linears=(
        ("q_proj", "d", "d"),
        ("k_proj", "d", "d"),
        ("v_proj", "d", "d"),
        ("out_proj", "d", "d"),
        ("fc1", "d", "ff"),
        ("fc2", "ff", "d"),
    ),
    lora_targets=False,
)
"""LayerNorm, learned positions offset by 2, biased separate q/k/v/out, ReLU MLP."""
OTHER = BlockFamily(
    name="", script="gpt", rope=False, gated_mlp=False, fused_qkv=False, fp8_linears=_LLAMA_LINEARS, lora_targets=False
)
"""Any other transformers architecture (counted on the meta device, traced, never replayed): the
formulas' fallbacks; fp8 assumes transformers' usual projection names (Llama's)."""

BLOCK_FAMILIES = {family.name: family for family in (LLAMA, GPT2, OPT)}


def block_family(name: str) -> BlockFamily:
    """The family object of `ModelDescription.family` (`OTHER` for a family without formulas)."""
    return BLOCK_FAMILIES.get(name, OTHER)
