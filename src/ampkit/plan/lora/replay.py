"""The LoRA step script for the analytic ledger (`ampkit.plan.lora.ledger`): a `Replay` of the bytes a LoRA
training step of ampkit's Llama model allocates and frees, in autograd's order.

Per adapted projection (peft's `lora.Linear`: `base(x) + lora_B(lora_A(x.float())) * scaling`):
- forward: the frozen base matmul saves only its weight (an autocast copy when the base is fp32 under
  *-mixed: a frozen weight needs no input saved); peft casts the input to fp32, autocast casts it back
  to the compute dtype for lora_A, and that copy is saved (lora_A's weight gradient needs it), as is
  lora_A's rank-r output (lora_B's); autocast caches bf16 copies of the fp32 adapters (saved: lora_B's
  always, lora_A's when its input needs a gradient);
- backward: the adapter branch first (its nodes are younger): the scaling's gradient, lora_B's weight
  gradient (cast to fp32) and input gradient, lora_A's, the casts back; then the base's input gradient,
  summed into the input's gradient.
Norms save their fp32 input and rstd (no weight gradient: nothing else); block 0's first norm and
q/k/v base saves nothing (the frozen embedding's output needs no gradient). The residual stream is in
the base's dtype. Every block is replayed (no folding: the cost is a few thousand steps at 70B).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.plan.analytic.dims import Widths
from ampkit.plan.analytic.ledger import loss_backward, loss_forward
from ampkit.plan.analytic.replay import Replay
from ampkit.plan.numerics import FP32_BYTES

BATCH_BYTES_PER_TOKEN = 16  # int64 input ids + int64 targets
MLP_SAVED = ("gate", "act", "up")
ATTN = ("q_proj", "k_proj", "v_proj")
MLP_IN = ("gate_proj", "up_proj")


@dataclass(frozen=True)
class LoraDims(Widths):
    """Widths and byte sizes of a LoRA step (bytes per element)."""

    rank: int
    """the adapters' rank r"""
    storage_bytes: int
    """the residual stream and the unquantised base (the embedding's storage dtype)"""
    compute_bytes: int
    """matmul outputs (the autocast dtype under *-mixed, else storage_bytes)"""
    auto: bool
    nf4: bool

    @property
    def base_cast(self) -> bool:
        """autocast casts each frozen base weight to c per call (an fp32 base under *-mixed)"""
        return self.auto and not self.nf4 and self.storage_bytes != self.compute_bytes

    def widths(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection."""
        d, q, kv, ff = self.d, self.q, self.kv, self.ff
        return {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, ff),
            "up_proj": (d, ff),
            "down_proj": (ff, d),
        }


@dataclass(frozen=True)
class Flow:
    """Which tensors of a block need a gradient: its input, q/k/v (and so attention), the stream after
    attention, the MLP's gate/up outputs."""

    x: bool
    qkv: bool
    x2: bool
    mlp: bool

    def input_grad(self, proj: str) -> bool:
        """Whether `proj`'s input needs a gradient (its weight copy and base backward are needed then)."""
        if proj in ATTN:
            return self.x
        if proj == "o_proj":
            return self.qkv
        return self.x2 if proj in MLP_IN else self.mlp


class LoraReplay:
    """The step: static state, forward, backward, optimizer step (see the module docstring)."""

    def __init__(self, dims: LoraDims, *, n_layers: int, tokens: int, seq_len: int, head_dim: int, static, ckpt=False):
        self.dims, self.L, self.T, self.seq, self.hd = dims, n_layers, tokens, seq_len, head_dim
        self.static_lines = static
        """{line: bytes} held before the step (parameters, optimizer states, held gradients)"""
        self.ckpt = ckpt
        self.adapted: set[str] = set()
        self.unsaved: list[str] = []
        """autocast's cached copies nothing saved: freed when the forward context exits"""
        self.replay = Replay()

    def run(self) -> Replay:
        self.replay.moment = "start of step"
        for line, nbytes in self.static_lines.items():
            self.replay.alloc(f"static.{line}", line, nbytes)
        self.forward()
        self.backward()
        self.replay.moment = "optimizer step"
        return self.replay

    # -- helpers -------------------------------------------------------------------------------
    def tok(self, name: str, line: str, per_token: float) -> None:
        self.replay.alloc(name, line, per_token * self.T)

    def tmp(self, name: str, per_token: float) -> None:
        self.tok(name, "temporaries", per_token)

    def free(self, *names: str) -> None:
        self.replay.free(*names)

    def sum_into(self, total: str, part: str, *, width: int, in_place: bool = False) -> None:
        """Autograd adds an input's gradient contributions as they arrive: the first is kept, each later
        one is added out of place into a new buffer (the two parts freed)."""
        if not self.replay.is_live(total):
            self.replay.rename(part, total)
            return
        if in_place:
            self.free(part)
            return
        self.tmp(total + ".new", self.dims.storage_bytes * width)
        self.free(total, part)
        self.replay.rename(total + ".new", total)

    def out_bytes(self) -> int:
        """A matmul output's bytes per element (the compute dtype; the stream's without autocast)."""
        return self.dims.compute_bytes

    # -- forward -------------------------------------------------------------------------------
    def forward(self) -> None:
        replay, dims = self.replay, self.dims
        replay.moment = "forward"
        self.tok("batch", "activations", BATCH_BYTES_PER_TOKEN)
        replay.alloc("rope", "activations", 2 * self.seq * (self.hd // 2) * FP32_BYTES)
        for k in range(self.L):
            replay.moment = f"forward: block {k}"
            if self.ckpt:
                self.tok(f"ckpt.{k}", "activations", dims.storage_bytes * dims.d)
                self.weight_copies(k, self.flow(k), cached_only=True)
            else:
                self.block_saved(k)
        self.forward_head()

    def flow(self, k: int) -> Flow:
        """Which of block k's tensors need a gradient: autograd saves and computes only for those. Block
        0's input (the frozen embedding's output) needs none; a tensor downstream of an adapter does."""
        t = self.targets
        x = k > 0
        qkv = x or any(p in t for p in ATTN)
        x2 = qkv or "o_proj" in t
        return Flow(x=x, qkv=qkv, x2=x2, mlp=x2 or any(p in t for p in MLP_IN))

    def weight_copies(self, k: int, flow: Flow, *, cached_only: bool = False) -> None:
        """autocast's low-precision copies: the adapters' (cached), and a cast base's (per call); a copy
        is saved when the projection's input needs a gradient (lora_B's always: its input does)."""
        dims = self.dims
        if not dims.auto:
            return
        for proj, (din, dout) in self.projections():
            needed = flow.input_grad(proj)
            if proj in self.targets:
                self.replay.alloc(f"{k}.{proj}.Bc", "weight_copies", dims.compute_bytes * dout * dims.rank)
                self.replay.alloc(f"{k}.{proj}.Ac", "weight_copies", dims.compute_bytes * dims.rank * din)
                if not needed or cached_only:
                    self.unsaved.append(f"{k}.{proj}.Ac")
                if cached_only:
                    self.unsaved.append(f"{k}.{proj}.Bc")
            if dims.base_cast and needed and not cached_only:
                self.replay.alloc(f"{k}.{proj}.Wc", "weight_copies", dims.compute_bytes * din * dout)

    def projections(self):
        return list(self.dims.widths().items())

    @property
    def targets(self) -> set[str]:
        return self.adapted

    def adapter_saved(self, k: int, proj: str, din: int, in_bytes: int, shared: str | None) -> None:
        """What an adapted projection's adapter saves: its input copy (autocast), or nothing new when the
        fp32 input itself is saved (`shared`, once for the projections that read it), and its rank-r middle."""
        dims = self.dims
        if dims.auto:
            self.tok(f"{k}.{proj}.xA", "activations", dims.compute_bytes * din)
        elif shared is not None and not self.replay.is_live(shared):
            self.tok(shared, "activations", in_bytes * din)
        self.tok(f"{k}.{proj}.a", "activations", self.out_bytes() * dims.rank)

    def block_saved(self, k: int, *, recompute: bool = False) -> None:
        """Everything block k's forward leaves saved for backward (activations and weight copies). In a
        recompute, an fp32 block input saved by its norm is the checkpoint's own input (nothing new)."""
        dims, c, f = self.dims, self.out_bytes(), self.flow(k)
        self.weight_copies(k, f)
        if f.x and not (recompute and dims.storage_bytes == FP32_BYTES):
            self.tok(f"{k}.n1.x", "activations", FP32_BYTES * dims.d)
        if f.x:
            self.tok(f"{k}.n1.rstd", "activations", FP32_BYTES)
        for proj in ATTN:
            if proj in self.targets:
                self.adapter_saved(k, proj, dims.d, dims.storage_bytes, f"{k}.n1.y")
        if f.qkv:  # flash attention keeps q, k, v, its output and the logsumexp
            for name, width in (("a.q", dims.q), ("a.k", dims.kv), ("a.v", dims.kv), ("a.out", dims.q)):
                self.tok(f"{k}.{name}", "activations", c * width)
            self.tok(f"{k}.a.lse", "activations", FP32_BYTES * dims.heads)
        if "o_proj" in self.targets:
            self.adapter_saved(k, "o_proj", dims.q, c, f"{k}.a.clone")
        if f.x2:
            self.tok(f"{k}.n2.x", "activations", FP32_BYTES * dims.d)
            self.tok(f"{k}.n2.rstd", "activations", FP32_BYTES)
        for proj in MLP_IN:
            if proj in self.targets:
                self.adapter_saved(k, proj, dims.d, dims.storage_bytes, f"{k}.n2.y")
        if f.mlp:
            for name in MLP_SAVED:
                self.tok(f"{k}.m.{name}", "activations", c * dims.ff)
        if "down_proj" in self.targets:
            self.adapter_saved(k, "down_proj", dims.ff, c, f"{k}.m.prod")

    def forward_head(self) -> None:
        replay, dims = self.replay, self.dims
        replay.moment = "forward: final norm and head"
        self.tok("f.x", "activations", FP32_BYTES * dims.d)
        self.tok("f.rstd", "activations", FP32_BYTES)
        if dims.base_cast:
            replay.alloc("head.Wc", "weight_copies", dims.compute_bytes * dims.vocab * dims.d)
        replay.moment = "forward: logits and loss"
        loss_forward(replay, tokens=self.T, vocab=dims.vocab, logits_bytes=self.out_bytes())
        self.free(*self.unsaved)  # autocast's cache dies with the forward context

    # -- backward ------------------------------------------------------------------------------
    def backward(self) -> None:
        replay, dims = self.replay, self.dims
        replay.moment = "backward: loss"
        loss_backward(replay, tokens=self.T, vocab=dims.vocab, logits_bytes=self.out_bytes())
        replay.moment = "backward: output head"
        self.tmp("g.y", self.out_bytes() * dims.d)
        self.free("g.logits", "head.Wc")
        self.cast_back("g.y", dims.d)
        replay.moment = "backward: final norm"
        self.norm_backward("f", "g.y", free_first=False)
        replay.rename("f.gx", "g.res")
        for k in reversed(range(self.L)):
            replay.moment = f"backward: block {k}"
            if self.ckpt:
                self.recompute(k)
            self.block_backward(k)
            self.free(f"ckpt.{k}")
        self.free("g.res", "g.res.old", "rope")

    def recompute(self, k: int) -> None:
        """A checkpointed block's forward again, up to its last saved tensor (non-reentrant checkpointing
        stops there): its saved tensors, and what is alive at the stop (the down projection's base output
        and input, peft's fp32 copy of that input, the block's residual stream)."""
        dims, c = self.dims, self.out_bytes()
        self.replay.moment = f"backward: block {k}"
        self.block_saved(k, recompute=True)
        tail = {"rc.x2": dims.storage_bytes * dims.d, "rc.y": dims.storage_bytes * dims.d}
        if "down_proj" not in self.targets:  # the MLP's product saves last
            tail["rc.prod"] = c * dims.ff
        else:
            tail["rc.out"] = c * dims.d
            if dims.auto:
                tail |= {"rc.prod": c * dims.ff, "rc.x32": FP32_BYTES * dims.ff}
        for name, per_token in tail.items():
            self.tok(name, "activations", per_token)
        self.free(*tail)  # the block's input (ckpt.k) lives until the block's backward is done

    def cast_back(self, name: str, width: int) -> None:
        """An autocast input's gradient cast back to the stream's dtype (when they differ)."""
        dims = self.dims
        if dims.auto and dims.storage_bytes != self.out_bytes():
            self.tmp(name + ".s", dims.storage_bytes * width)
            self.free(name)
            self.replay.rename(name + ".s", name)

    def norm_backward(self, pre: str, g_in: str, *, free_first: bool) -> None:
        """RMSNorm with a frozen gain: the fp32 math of its input gradient (x * rstd's backward)."""
        dims = self.dims
        self.tmp(f"{pre}.gn", dims.storage_bytes * dims.d)  # g * weight
        if free_first:
            self.free(g_in)
        if dims.storage_bytes != FP32_BYTES:
            self.tmp(f"{pre}.gn32", FP32_BYTES * dims.d)
            self.free(f"{pre}.gn")
            self.replay.rename(f"{pre}.gn32", f"{pre}.gn")
        self.tmp(f"{pre}.A", FP32_BYTES * dims.d)  # g * rstd
        self.tmp(f"{pre}.B", FP32_BYTES * dims.d)  # g * x
        self.tmp(f"{pre}.Bs", FP32_BYTES)
        self.free(f"{pre}.B", f"{pre}.gn", f"{pre}.rstd")
        self.tmp(f"{pre}.D", FP32_BYTES * dims.d)
        self.free(f"{pre}.Bs")
        for part in ("P", "M", "E"):
            self.tmp(f"{pre}.{part}", FP32_BYTES * dims.d)
        self.free(f"{pre}.P", f"{pre}.M", f"{pre}.D", f"{pre}.x")
        self.tmp(f"{pre}.S", FP32_BYTES * dims.d)
        self.free(f"{pre}.A", f"{pre}.E")
        if dims.storage_bytes != FP32_BYTES:
            self.tmp(f"{pre}.gx", dims.storage_bytes * dims.d)
            self.free(f"{pre}.S")
        else:
            self.replay.rename(f"{pre}.S", f"{pre}.gx")
        if not free_first:
            self.free(g_in)

    def linear_backward(
        self, k: int, proj: str, g_out: str | None, total: str, *, shared: str | None, need_input: bool = True
    ) -> None:
        """An adapted (or plain frozen) projection's backward; its input gradient (when `need_input`) is
        summed into `total`; `g_out` (its output's gradient) is freed after the last matmul that reads it."""
        dims, c = self.dims, self.out_bytes()
        din, dout = dims.widths()[proj]
        p = f"{k}.{proj}"
        if proj in self.targets:
            self.tmp(f"{p}.gs", c * dout)  # the scaling's gradient
            self.replay.alloc(f"{p}.wB", "temporaries", c * dout * dims.rank)
            self.tmp(f"{p}.ga", c * dims.rank)
            self.free(f"{p}.gs", f"{p}.Bc", f"{p}.a")
            self.adapter_grad(f"{p}.wB", dout * dims.rank)
            self.replay.alloc(f"{p}.wA", "temporaries", c * dims.rank * din)
            if need_input:
                self.tmp(f"{p}.gx", c * din)
            self.free(f"{p}.ga", f"{p}.Ac", f"{p}.xA")
            if shared is not None and proj == self.last_reader(shared):
                self.free(shared)
            if need_input and dims.auto:
                self.tmp(f"{p}.gx32", FP32_BYTES * din)  # autocast's cast back to fp32
                self.free(f"{p}.gx")
                self.replay.rename(f"{p}.gx32", f"{p}.gx")
            self.adapter_grad(f"{p}.wA", dims.rank * din)
            if need_input:
                if dims.auto and dims.storage_bytes != FP32_BYTES:  # peft's cast of the input to fp32, undone
                    self.tmp(f"{p}.gxs", dims.storage_bytes * din)
                    self.free(f"{p}.gx")
                    self.replay.rename(f"{p}.gxs", f"{p}.gx")
                self.sum_into(total, f"{p}.gx", width=din)
        if not need_input:
            self.free(*([g_out] if g_out else []))
            return
        if dims.nf4 and proj in self.targets:
            self.replay.alloc(f"{p}.Wdq", "temporaries", c * din * dout)  # dequantised for the input gradient
        self.tmp(f"{p}.gb", c * din)
        self.free(f"{p}.Wdq", f"{p}.Wc", *([g_out] if g_out else []))
        self.cast_back(f"{p}.gb", din)
        self.sum_into(total, f"{p}.gb", width=din)

    def adapter_grad(self, name: str, elements: int) -> None:
        """An adapter's weight gradient, cast to fp32 under autocast, lands in `.grad` (with gradients held
        from earlier micro-batches it is added into them in place, and freed)."""
        held = "gradients" in self.static_lines
        if self.out_bytes() != FP32_BYTES:
            self.replay.alloc(name + ".32", "temporaries" if held else "gradients", FP32_BYTES * elements)
            self.free(name)
        elif not held:
            self.replay.move(name, "gradients")
            self.replay.rename(name, name + ".32")
        else:
            self.replay.rename(name, name + ".32")
        if held:
            self.free(name + ".32")

    def last_reader(self, shared: str) -> str:
        """The projection whose adapter backward runs last among those saving `shared` (autograd order)."""
        readers = {"n1.y": ("v_proj", "k_proj", "q_proj"), "n2.y": ("up_proj", "gate_proj")}
        single = {"a.clone": "o_proj", "m.prod": "down_proj"}
        key = shared.split(".", 1)[1]
        if key in single:
            return single[key]
        adapted = [p for p in readers[key] if p in self.targets]
        return adapted[-1] if adapted else ""

    def branch_grad(self, k: int, label: str) -> str | None:
        """The gradient a branch's output sees: a compute-dtype copy of the residual gradient when the
        stream is wider (an fp32 base under *-mixed), else the residual gradient itself (None: not freed)."""
        if self.out_bytes() == self.dims.storage_bytes:
            return None
        name = f"{k}.{label}.gc"
        self.tmp(name, self.out_bytes() * self.dims.d)
        return name

    def block_backward(self, k: int) -> None:
        dims, c, f = self.dims, self.out_bytes(), self.flow(k)
        g = self.branch_grad(k, "mlp")
        self.linear_backward(k, "down_proj", g, "g.prod", shared=f"{k}.m.prod", need_input=f.mlp)
        if f.mlp:
            self.tmp("g.act", c * dims.ff)
            self.tmp("g.up", c * dims.ff)
            self.free("g.prod", f"{k}.m.act", f"{k}.m.up")
            self.linear_backward(k, "up_proj", "g.up", "g.y2", shared=f"{k}.n2.y", need_input=f.x2)
            self.tmp("g.gate", c * dims.ff)
            self.free("g.act", f"{k}.m.gate")
            self.linear_backward(k, "gate_proj", "g.gate", "g.y2", shared=f"{k}.n2.y", need_input=f.x2)
        if f.x2:
            self.norm_backward(f"{k}.n2", "g.y2", free_first=True)
            self.residual_sum(f"{k}.n2.gx")
            self.attention_backward(k, f)

    def residual_sum(self, part: str) -> None:
        """A norm's input gradient added to the residual stream's: in place when the stream is fp32;
        otherwise into a new buffer, the previous residual gradient living on until the next sum."""
        dims = self.dims
        if dims.storage_bytes == FP32_BYTES:
            self.free(part)
            return
        self.free("g.res.old")
        self.tmp("g.res.new", dims.storage_bytes * dims.d)
        self.free(part)
        self.replay.rename("g.res", "g.res.old")
        self.replay.rename("g.res.new", "g.res")

    def attention_backward(self, k: int, f: Flow) -> None:
        dims, c = self.dims, self.out_bytes()
        g = self.branch_grad(k, "attn")
        self.linear_backward(k, "o_proj", g, "g.clone", shared=f"{k}.a.clone", need_input=f.qkv)
        if not f.qkv:
            return
        for name, width in (("g.q", dims.q), ("g.k", dims.kv), ("g.v", dims.kv)):
            self.tmp(name, c * width)
        self.free("g.clone", f"{k}.a.q", f"{k}.a.k", f"{k}.a.v", f"{k}.a.out", f"{k}.a.lse")
        # q and k rotated back in fp32
        self.tmp("g.rope", 2 * FP32_BYTES * dims.q + (FP32_BYTES * dims.q if c != FP32_BYTES else 0))
        self.free("g.rope")
        for proj, g_proj in (("v_proj", "g.v"), ("k_proj", "g.k"), ("q_proj", "g.q")):
            self.linear_backward(k, proj, g_proj, "g.y1", shared=f"{k}.n1.y", need_input=f.x)
        if f.x:
            self.norm_backward(f"{k}.n1", "g.y1", free_first=True)
            self.residual_sum(f"{k}.n1.gx")
