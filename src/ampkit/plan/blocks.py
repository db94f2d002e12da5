"""What one transformer block allocates, per family: the tensors its forward saves for backward,
and its backward as a script of allocations and frees (bytes per token x tokens).

The scripts follow the ops of `ampkit.models.llama` (Llama family, checked against the traced
engine) and of Hugging Face's GPT-2 / OPT blocks (analytic only until the HF adapter lands: a fused
GELU kernel is assumed, and LayerNorm's backward is the native fused kernel).

Dtypes: `p` is the parameter and residual-stream dtype (fp32 under mixed precision), `c` the
compute dtype of matmul outputs, F = 4 bytes for the fp32 parts (norm statistics, RoPE, softmax
statistics). Under autocast every Linear saves its own low-precision copy of its input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampkit.plan.numerics import FP32_BYTES as F

if TYPE_CHECKING:
    from ampkit.plan.ledger import StepReplay

RMS_WIDEST = 5  # RMSNorm's backward (python ops): at most five (tokens, d) fp32 buffers at once
LN_WIDEST = 2  # LayerNorm's fused backward kernel: input gradient + one fp32 scratch (assumed)


def rms_saved(pre: str, st: StepReplay) -> list[tuple[str, float]]:
    """RMSNorm saves its input in fp32 (the input itself when fp32, else an fp32 copy), the rsqrt
    statistic, the normalized tensor, and (without autocast) its output for the Linears after it."""
    x = st.x
    items: list[tuple[str, float]] = [
        (f"{pre}.x", F * x.d),
        (f"{pre}.rstd", F),
        (f"{pre}.normed", (F if x.p == F else x.p) * x.d),
    ]
    return items if x.auto else items + [(f"{pre}.y", x.p * x.d)]


def ln_saved(pre: str, st: StepReplay) -> list[tuple[str, float]]:
    """LayerNorm (native kernel) saves its input as is, mean and rstd in fp32, and (without
    autocast) its output for the Linear after it."""
    x = st.x
    items: list[tuple[str, float]] = [(f"{pre}.x", x.p * x.d), (f"{pre}.stats", 2 * F)]
    return items if x.auto else items + [(f"{pre}.y", x.p * x.d)]


def _casts(names: tuple[str, ...], st: StepReplay) -> list[tuple[str, float]]:
    return [(name, st.x.c * st.x.d) for name in names] if st.x.auto else []


def llama_saved(st: StepReplay) -> list[tuple[str, float]]:
    x = st.x
    c, q, kv, ff = x.c, x.q, x.kv, x.ff
    return [
        *rms_saved("n1", st),
        *_casts(("a.in_q", "a.in_k", "a.in_v"), st),
        ("a.v", c * kv),
        ("a.q", c * q),
        ("a.k", c * kv),
        ("a.out", c * q),
        ("a.lse", F * x.heads),
        ("a.clone", c * q),
        *rms_saved("n2", st),
        *_casts(("m.in_gate", "m.in_up"), st),
        ("m.gate", c * ff),
        ("m.act", c * ff),
        ("m.up", c * ff),
        ("m.prod", c * ff),
    ]


def llama_weights(st: StepReplay) -> dict[str, int]:
    """Matmul weights of a block by name (elements); the names tie copies to gradients."""
    d, q, kv, ff = st.x.d, st.x.q, st.x.kv, st.x.ff
    return {"q": d * q, "k": d * kv, "v": d * kv, "o": q * d, "gate": d * ff, "up": d * ff, "down": ff * d}


def llama_backward(st: StepReplay, k: int) -> None:
    """SwiGLU MLP, RMSNorm, attention with RoPE, in autograd's order."""
    x, a = st.x, st.saved_name(k)
    c, d, q, kv, ff = x.c, x.d, x.q, x.kv, x.ff
    st.moment(k, "mlp")
    g = st.branch_grad()
    st.block_linear(k, "down", g_out=g, in_bytes=c * ff, cast_back=False, frees=(a("m.prod"),), out="g.prod")
    st.alloc_tmp("g.act", c * ff)
    st.alloc_tmp("g.up", c * ff)
    st.free("g.prod", a("m.act"), a("m.up"))
    st.block_linear(
        k, "up", g_out="g.up", in_bytes=c * d, cast_back=x.auto, frees=(a("m.in_up"),), out="g.y_up", sum_into="g.y"
    )
    st.alloc_tmp("g.gate", c * ff)
    st.free("g.act", a("m.gate"))
    st.block_linear(
        k,
        "gate",
        g_out="g.gate",
        in_bytes=c * d,
        cast_back=x.auto,
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
    st.alloc_tmp("g.rope", 2 * F * q + (F * q if c != F else 0))
    st.free("g.rope")
    st.moment(k, "qkv")
    _separate_qkv_backward(st, k, {"q": "g.q", "k": "g.k", "v": "g.v"})
    st.norm_backward(k, "attn", widest=RMS_WIDEST, early=(a("n1.normed"), a("n1.rstd")), late=(a("n1.x"),))


def gpt_saved(st: StepReplay) -> list[tuple[str, float]]:
    """GPT-2 (fused c_attn, GELU) or OPT (separate q/k/v, ReLU): LayerNorm, no RoPE; dropout masks
    (1 byte per element) after attention and MLP when the config trains with dropout."""
    x, fused = st.x, st.desc.family == "gpt2"
    c, d, q, kv, ff = x.c, x.d, x.q, x.kv, x.ff
    inputs = ("a.in",) if fused else ("a.in_q", "a.in_k", "a.in_v")
    attn = [("a.qkv", c * (q + 2 * kv))] if fused else [("a.q", c * q), ("a.k", c * kv), ("a.v", c * kv)]
    mlp = [("m.h", c * ff), ("m.act", c * ff)] if fused else [("m.act", c * ff)]
    masks = [("a.mask", d), ("m.mask", d)] if st.desc.dropout > 0 else []
    return [
        *ln_saved("n1", st),
        *_casts(inputs, st),
        *attn,
        ("a.out", c * q),
        ("a.lse", F * x.heads),
        ("a.clone", c * q),
        *masks,
        *ln_saved("n2", st),
        *_casts(("m.in",), st),
        *mlp,
    ]


def gpt_weights(st: StepReplay) -> dict[str, int]:
    d, q, kv, ff = st.x.d, st.x.q, st.x.kv, st.x.ff
    attn = {"qkv": d * (q + 2 * kv)} if st.desc.family == "gpt2" else {"q": d * q, "k": d * kv, "v": d * kv}
    return {**attn, "o": q * d, "fc_in": d * ff, "fc_out": ff * d}


def gpt_backward(st: StepReplay, k: int) -> None:
    x, a, fused = st.x, st.saved_name(k), st.desc.family == "gpt2"
    c, d, q, kv, ff = x.c, x.d, x.q, x.kv, x.ff
    st.moment(k, "mlp")
    g = st.branch_grad()
    st.block_linear(k, "fc_out", g_out=g, in_bytes=c * ff, cast_back=False, frees=(a("m.mask"),), out="g.act")
    st.alloc_tmp("g.h", c * ff)  # GELU / ReLU backward
    st.free("g.act", a("m.act"), a("m.h"))
    st.block_linear(k, "fc_in", g_out="g.h", in_bytes=c * d, cast_back=x.auto, frees=(a("m.in"), a("n2.y")), out="g.y")
    st.norm_backward(k, "mlp", widest=LN_WIDEST, early=(), late=(a("n2.x"), a("n2.stats")))
    st.moment(k, "attention")
    g = st.branch_grad()
    st.block_linear(k, "o", g_out=g, in_bytes=c * q, cast_back=False, frees=(a("a.clone"), a("a.mask")), out="g.clone")
    st.alloc_tmp("g.qkv", c * (q + 2 * kv))
    st.free("g.clone", a("a.qkv"), a("a.q"), a("a.k"), a("a.v"), a("a.out"), a("a.lse"))
    if fused:
        st.block_linear(
            k, "qkv", g_out="g.qkv", in_bytes=c * d, cast_back=x.auto, frees=(a("a.in"), a("n1.y")), out="g.y"
        )
    else:  # one g.qkv buffer for the three: the last projection's backward frees it
        _separate_qkv_backward(st, k, {"q": None, "k": None, "v": "g.qkv"})
    st.norm_backward(k, "attn", widest=LN_WIDEST, early=(), late=(a("n1.x"), a("n1.stats")))


def _separate_qkv_backward(st: StepReplay, k: int, g_outs: dict[str, str | None]) -> None:
    """The backward of separate q, k and v projections, each releasing its incoming gradient from
    `g_outs` (None: nothing yet); autograd adds each input gradient into g.y as it arrives. Then the
    first norm's output is released."""
    x, a = st.x, st.saved_name(k)
    for proj, g_out in g_outs.items():
        st.block_linear(
            k,
            proj,
            g_out=g_out,
            in_bytes=x.c * x.d,
            cast_back=x.auto,
            frees=(a(f"a.in_{proj}"),),
            out=f"g.y_{proj}",
            sum_into="g.y",
        )
    st.free(a("n1.y"))
