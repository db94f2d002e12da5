"""What one transformer block allocates, per family: the tensors its forward saves for backward,
and its backward as a script of allocations and frees (bytes per token x tokens).

The scripts follow the ops of `ampkit.models.llama` (Llama family, checked against the traced
engine) and of Hugging Face's GPT-2 / OPT blocks (analytic only until the HF adapter lands: a fused
GELU kernel is assumed, and LayerNorm's backward is the native fused kernel).

Bytes per element (`Dims`): `param_bytes` (locally `p`) is the parameter and residual-stream dtype's
(fp32 under mixed precision), `compute_bytes` (locally `c`) the compute dtype's of matmul outputs,
FP32_BYTES = 4 for the fp32 parts (norm statistics, RoPE, softmax statistics). Under autocast every
Linear saves its own low-precision copy of its input. Each family's script is a `BlockScript`, chosen
by its `BlockFamily.script` (`SCRIPTS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ampkit.plan.analytic.dims import Dims
from ampkit.plan.describe import ModelDescription
from ampkit.plan.numerics import FP32_BYTES


class BlockSteps(Protocol):
    """What a block's script calls on the step replay (`ledger.StepReplay` implements it)."""

    dims: Dims
    desc: ModelDescription

    def saved_name(self, k: int) -> Callable[[str], str]: ...
    def alloc_tmp(self, name: str, per_token: float) -> None: ...
    def free(self, *names: str | None) -> None: ...
    def moment(self, k: int, label: str) -> None: ...
    def branch_grad(self) -> str | None: ...
    def block_linear(self, k: int, weight: str, **kwargs) -> None: ...
    def norm_backward(
        self, k: int | None, label: str, *, widest: float, early: tuple[str, ...], late: tuple[str, ...]
    ) -> None: ...


RMS_WIDEST = 5  # RMSNorm's backward (python ops): at most five (tokens, d) fp32 buffers at once
LN_WIDEST = 2  # LayerNorm's fused backward kernel: input gradient + one fp32 scratch (assumed)


def rms_saved(pre: str, st: BlockSteps) -> list[tuple[str, float]]:
    """RMSNorm saves its input in fp32 (the input itself when fp32, else an fp32 copy), the rsqrt
    statistic, the normalized tensor, and (without autocast) its output for the Linears after it."""
    dims = st.dims
    items: list[tuple[str, float]] = [
        (f"{pre}.x", FP32_BYTES * dims.d),
        (f"{pre}.rstd", FP32_BYTES),
        (f"{pre}.normed", (FP32_BYTES if dims.param_bytes == FP32_BYTES else dims.param_bytes) * dims.d),
    ]
    return items if dims.auto else [*items, (f"{pre}.y", dims.param_bytes * dims.d)]


def ln_saved(pre: str, st: BlockSteps) -> list[tuple[str, float]]:
    """LayerNorm (native kernel) saves its input as is, mean and rstd in fp32, and (without
    autocast) its output for the Linear after it."""
    dims = st.dims
    items: list[tuple[str, float]] = [(f"{pre}.x", dims.param_bytes * dims.d), (f"{pre}.stats", 2 * FP32_BYTES)]
    return items if dims.auto else [*items, (f"{pre}.y", dims.param_bytes * dims.d)]


def _casts(names: tuple[str, ...], st: BlockSteps) -> list[tuple[str, float]]:
    return [(name, st.dims.compute_bytes * st.dims.d) for name in names] if st.dims.auto else []


def llama_saved(st: BlockSteps) -> list[tuple[str, float]]:
    dims = st.dims
    c, q, kv, ff = dims.compute_bytes, dims.q, dims.kv, dims.ff
    return [
        *rms_saved("n1", st),
        *_casts(("a.in_q", "a.in_k", "a.in_v"), st),
        ("a.v", c * kv),
        ("a.q", c * q),
        ("a.k", c * kv),
        ("a.out", c * q),
        ("a.lse", FP32_BYTES * dims.heads),
        ("a.clone", c * q),
        *rms_saved("n2", st),
        *_casts(("m.in_gate", "m.in_up"), st),
        ("m.gate", c * ff),
        ("m.act", c * ff),
        ("m.up", c * ff),
        ("m.prod", c * ff),
    ]


def llama_weights(st: BlockSteps) -> dict[str, int]:
    """Matmul weights of a block by name (elements); the names tie copies to gradients."""
    d, q, kv, ff = st.dims.d, st.dims.q, st.dims.kv, st.dims.ff
    return {"q": d * q, "k": d * kv, "v": d * kv, "o": q * d, "gate": d * ff, "up": d * ff, "down": ff * d}


def llama_backward(st: BlockSteps, k: int) -> None:
    """SwiGLU MLP, RMSNorm, attention with RoPE, in autograd's order."""
    dims, a = st.dims, st.saved_name(k)
    c, d, q, kv, ff = dims.compute_bytes, dims.d, dims.q, dims.kv, dims.ff
    st.moment(k, "mlp")
    g = st.branch_grad()
    st.block_linear(k, "down", g_out=g, in_bytes=c * ff, cast_back=False, frees=(a("m.prod"),), out="g.prod")
    st.alloc_tmp("g.act", c * ff)
    st.alloc_tmp("g.up", c * ff)
    st.free("g.prod", a("m.act"), a("m.up"))
    st.block_linear(
        k, "up", g_out="g.up", in_bytes=c * d, cast_back=dims.auto, frees=(a("m.in_up"),), out="g.y_up", sum_into="g.y"
    )
    st.alloc_tmp("g.gate", c * ff)
    st.free("g.act", a("m.gate"))
    st.block_linear(
        k,
        "gate",
        g_out="g.gate",
        in_bytes=c * d,
        cast_back=dims.auto,
        frees=(a("m.in_gate"), a("n2.y")),
        out="g.y_gate",
        sum_into="g.y",
    )
    st.norm_backward(k, "mlp", widest=RMS_WIDEST, early=(a("n2.normed"), a("n2.rstd")), late=(a("n2.x"),))
    st.moment(k, "attention")
    g = st.branch_grad()
    st.block_linear(k, "o", g_out=g, in_bytes=c * q, cast_back=False, frees=(a("a.clone"),), out="g.clone")
    for name, width in (("g.q", q), ("g.k", kv), ("g.v", kv)):
        st.alloc_tmp(name, c * width)
    st.free("g.clone", a("a.q"), a("a.k"), a("a.v"), a("a.out"), a("a.lse"))
    st.moment(k, "rope")  # rotation of the q and k gradients in fp32
    st.alloc_tmp("g.rope", 2 * FP32_BYTES * q + (FP32_BYTES * q if c != FP32_BYTES else 0))
    st.free("g.rope")
    st.moment(k, "qkv")
    _separate_qkv_backward(st, k, {"q": "g.q", "k": "g.k", "v": "g.v"})
    st.norm_backward(k, "attn", widest=RMS_WIDEST, early=(a("n1.normed"), a("n1.rstd")), late=(a("n1.x"),))


def gpt_saved(st: BlockSteps) -> list[tuple[str, float]]:
    """GPT-2 (fused c_attn, GELU) or OPT (separate q/k/v, ReLU): LayerNorm, no RoPE; dropout masks
    (1 byte per element) after attention and MLP when the config trains with dropout."""
    dims, fused = st.dims, st.desc.block.fused_qkv
    c, d, q, kv, ff = dims.compute_bytes, dims.d, dims.q, dims.kv, dims.ff
    inputs = ("a.in",) if fused else ("a.in_q", "a.in_k", "a.in_v")
    attn = [("a.qkv", c * (q + 2 * kv))] if fused else [("a.q", c * q), ("a.k", c * kv), ("a.v", c * kv)]
    mlp = [("m.h", c * ff), ("m.act", c * ff)] if fused else [("m.act", c * ff)]
    masks = [("a.mask", d), ("m.mask", d)] if st.desc.dropout > 0 else []
    return [
        *ln_saved("n1", st),
        *_casts(inputs, st),
        *attn,
        ("a.out", c * q),
        ("a.lse", FP32_BYTES * dims.heads),
        ("a.clone", c * q),
        *masks,
        *ln_saved("n2", st),
        *_casts(("m.in",), st),
        *mlp,
    ]


def gpt_weights(st: BlockSteps) -> dict[str, int]:
    d, q, kv, ff = st.dims.d, st.dims.q, st.dims.kv, st.dims.ff
    attn = {"qkv": d * (q + 2 * kv)} if st.desc.block.fused_qkv else {"q": d * q, "k": d * kv, "v": d * kv}
    return {**attn, "o": q * d, "fc_in": d * ff, "fc_out": ff * d}


def gpt_backward(st: BlockSteps, k: int) -> None:
    dims, a, fused = st.dims, st.saved_name(k), st.desc.block.fused_qkv
    c, d, q, kv, ff = dims.compute_bytes, dims.d, dims.q, dims.kv, dims.ff
    st.moment(k, "mlp")
    g = st.branch_grad()
    st.block_linear(k, "fc_out", g_out=g, in_bytes=c * ff, cast_back=False, frees=(a("m.mask"),), out="g.act")
    st.alloc_tmp("g.h", c * ff)  # GELU / ReLU backward
    st.free("g.act", a("m.act"), a("m.h"))
    st.block_linear(
        k, "fc_in", g_out="g.h", in_bytes=c * d, cast_back=dims.auto, frees=(a("m.in"), a("n2.y")), out="g.y"
    )
    st.norm_backward(k, "mlp", widest=LN_WIDEST, early=(), late=(a("n2.x"), a("n2.stats")))
    st.moment(k, "attention")
    g = st.branch_grad()
    st.block_linear(k, "o", g_out=g, in_bytes=c * q, cast_back=False, frees=(a("a.clone"), a("a.mask")), out="g.clone")
    st.alloc_tmp("g.qkv", c * (q + 2 * kv))
    st.free("g.clone", a("a.qkv"), a("a.q"), a("a.k"), a("a.v"), a("a.out"), a("a.lse"))
    if fused:
        st.block_linear(
            k, "qkv", g_out="g.qkv", in_bytes=c * d, cast_back=dims.auto, frees=(a("a.in"), a("n1.y")), out="g.y"
        )
    else:  # one g.qkv buffer for the three: the last projection's backward frees it
        _separate_qkv_backward(st, k, {"q": None, "k": None, "v": "g.qkv"})
    st.norm_backward(k, "attn", widest=LN_WIDEST, early=(), late=(a("n1.x"), a("n1.stats")))


def _separate_qkv_backward(st: BlockSteps, k: int, g_outs: dict[str, str | None]) -> None:
    """The backward of separate q, k and v projections, each releasing its incoming gradient from
    `g_outs` (None: nothing yet); autograd adds each input gradient into g.y as it arrives. Then the
    first norm's output is released."""
    dims, a = st.dims, st.saved_name(k)
    for proj, g_out in g_outs.items():
        st.block_linear(
            k,
            proj,
            g_out=g_out,
            in_bytes=dims.compute_bytes * dims.d,
            cast_back=dims.auto,
            frees=(a(f"a.in_{proj}"),),
            out=f"g.y_{proj}",
            sum_into="g.y",
        )
    st.free(a("n1.y"))


@dataclass(frozen=True, kw_only=True)
class BlockScript:
    """One family's block script: what a block saves and holds, its backward, and its norm's."""

    saved: Callable[[BlockSteps], list[tuple[str, float]]]
    """the tensors one block's forward saves for backward (name, bytes per token)"""
    weights: Callable[[BlockSteps], dict[str, int]]
    """the block's matmul weights (elements)"""
    backward: Callable[[BlockSteps, int], None]
    """block k's backward, as allocations and frees"""
    norm_saved: Callable[[str, BlockSteps], list[tuple[str, float]]]
    """what a norm saves (the final norm's too)"""
    norm_widest: int
    """the most (tokens, d) fp32 buffers the norm's backward holds at once"""
    final_early: tuple[str, ...]
    """the final norm's saved tensors its backward frees before its widest moment"""


SCRIPTS = {
    "llama": BlockScript(
        saved=llama_saved,
        weights=llama_weights,
        backward=llama_backward,
        norm_saved=rms_saved,
        norm_widest=RMS_WIDEST,
        final_early=("f.rstd", "f.normed"),
    ),
    "gpt": BlockScript(
        saved=gpt_saved,
        weights=gpt_weights,
        backward=gpt_backward,
        norm_saved=ln_saved,
        norm_widest=LN_WIDEST,
        final_early=(),
    ),
}
"""The scripts by `BlockFamily.script` (GPT-2 and OPT share one, told apart by `fused_qkv`)."""
