"""The analytic memory ledger: a training step replayed as byte counts, instant at any size.

`StepReplay` runs the step's script on a `Replay` (named allocations and frees per ledger line),
following what the model's ops allocate and free, in order; the traced engine, which runs the real
step on fake tensors, checks it line by line (tests/plan/test_ledger.py):

- static: parameters, optimizer states, and (with gradient accumulation > 1) the gradients held
  from earlier micro-batches; fp32 master weights are a line of their own and are 0 in every
  ampkit regime (mixed precision's fp32 parameters *are* the master copy; bf16-true keeps none);
- forward: per block, the tensors autograd saves for backward (`blocks.llama_saved` /
  `blocks.gpt_saved`, with their dtypes) and autocast's low-precision weight copies; then logits
  and the fp32 loss (the loss upcasts logits: B*T*V*4 bytes of log-probabilities, and their
  gradient);
- backward: loss and head, then each block in reverse (`blocks.llama_backward` /
  `blocks.gpt_backward`): each Linear's two matmuls, the release of what it saved, the fp32 cast
  of an autocast input's gradient, the weight gradient made in the compute dtype then cast to the
  parameter dtype; then the embedding (a dense V x d gradient, plus the head's when tied);
- optimizer step: gradients and the logits the loop still holds; fused AdamW works in place.
With `checkpointing="full"` a block keeps only its input and its activations come back one block at
a time in backward. Per token, activations differ by regime exactly where the ops do: autocast
saves a low-precision copy of every matmul input *per Linear* and keeps the residual stream, norm
statistics and RoPE in fp32; bf16-true saves fp32 copies only inside RMSNorm.
Blocks 1 .. L-2 are replayed as lumps (see `_folded`): exact, and independent of depth.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.errors import UsageError
from ampkit.plan import blocks
from ampkit.plan.describe import ModelDescription
from ampkit.plan.numerics import FP32_BYTES as F
from ampkit.plan.numerics import get_numerics
from ampkit.plan.optim import optimizer_state_bytes
from ampkit.plan.replay import Replay
from ampkit.plan.setting import DEFAULT_RESERVE, Ledger, Reserve, StepSetting

BATCH_BYTES_PER_TOKEN = 16  # int64 input ids + int64 targets
FORWARD_SCRATCH_FP32 = 2  # short-lived (tokens, q) fp32 buffers inside a block's forward (RoPE)


@dataclass(frozen=True)
class Widths:
    """A decoder's widths in elements, the shape the replays read: model, query and key/value
    projections, MLP, heads, vocabulary."""

    d: int
    q: int
    kv: int
    ff: int
    heads: int
    vocab: int


def widths_of(desc: ModelDescription) -> dict[str, int]:
    """`Widths`' fields from a model description (to build a replay's dims with its byte sizes)."""
    return {
        "d": desc.d_model,
        "q": desc.q_dim,
        "kv": desc.kv_dim,
        "ff": desc.d_ff,
        "heads": desc.n_heads,
        "vocab": desc.vocab_size,
    }


@dataclass(frozen=True)
class Dims(Widths):
    """Model widths and the regime's byte sizes, the only numbers the replay needs."""

    p: int
    """parameter / residual-stream bytes per element"""
    c: int
    """compute (matmul output) bytes per element"""
    auto: bool
    """autocast: each Linear casts (and saves) its own low-precision input"""


class StepReplay:
    """The step script: static state, forward, backward, optimizer step, on a `Replay`."""

    def __init__(self, desc: ModelDescription, setting: StepSetting):
        if desc.max_positions and setting.seq_len > desc.max_positions:
            raise UsageError(
                f"--seq-len {setting.seq_len} exceeds {desc.name}'s {desc.max_positions} learned "
                "positions; use a shorter --seq-len"
            )
        self.desc, self.setting = desc, setting
        self.num = get_numerics(setting.precision)
        self.x = Dims(**widths_of(desc), p=self.num.param_bytes, c=self.num.compute_bytes, auto=self.num.autocast)
        llama = desc.family == "llama"
        self.saved = blocks.llama_saved(self) if llama else blocks.gpt_saved(self)
        self.weights = blocks.llama_weights(self) if llama else blocks.gpt_weights(self)
        self.block_backward = blocks.llama_backward if llama else blocks.gpt_backward
        # autocast keeps a low-precision copy of each Linear weight; Float8Linear keeps none; under
        # FSDP, MixedPrecisionPolicy's gathered low-precision blocks replace them (see `static`)
        copies = self.x.auto and not self.num.float8_block_linears and setting.shards == 1
        self.copy_bytes = self.x.c if copies else 0
        self.tokens = setting.tokens
        self.ckpt = setting.checkpointing == "full"
        self.held = setting.grad_accum > 1
        self.r = Replay()

    def run(self) -> Replay:
        self.static()
        self.forward()
        self.backward()
        self.optimizer_step()
        return self.r

    # -- helpers the block scripts use ----------------------------------------------------------
    def alloc_tmp(self, name: str, per_token: float) -> None:
        self.r.alloc(name, "temporaries", per_token * self.tokens)

    def free(self, *names: str | None) -> None:
        self.r.free(*[n for n in names if n])

    def moment(self, k: int, label: str) -> None:
        self.r.moment = f"backward: block {k} {label}"

    @staticmethod
    def saved_name(k: int):
        return lambda name: f"{k}.{name}"

    def branch_grad(self) -> str | None:
        """The residual gradient as a branch's output sees it: a compute-dtype copy when the
        residual is wider (mixed precision), else the residual gradient itself (nothing new)."""
        if self.x.c == self.x.p:
            return None
        self.alloc_tmp("g.cin", self.x.c * self.x.d)
        return "g.cin"

    def block_linear(self, k: int, weight: str, **kwargs) -> None:
        self.linear(f"{k}.{weight}", self.weights[weight], **kwargs)

    def linear(
        self,
        name: str,
        elements: int,
        *,
        g_out: str | None,
        in_bytes: float,
        cast_back: bool,
        frees: tuple[str, ...],
        out: str,
        sum_into: str | None = None,
        keep_as: str | None = None,
    ) -> None:
        """A Linear's backward: two matmuls (weight gradient, input gradient); then its incoming
        gradient, saved input and weight copy are released; an autocast input's gradient is cast
        back to fp32 (and added to `sum_into`); the weight gradient is cast to the parameter dtype
        and accumulated."""
        r, c, p = self.r, self.x.c, self.x.p
        if self.num.float8_block_linears and name != "head":
            # eager float8 scaling of the weight: |W|, then W * scale clamped, in fp32, then the fp8
            # copy (torch.compile fuses these away; the plan assumes eager, the larger)
            r.alloc("f8.scratch", "temporaries", (2 * F + 1) * elements)
            r.free("f8.scratch")
        r.alloc(f"wg.{name}", "temporaries", c * elements)
        self.alloc_tmp(out, in_bytes)
        self.free(g_out, f"cp.{name}", *frees)
        if cast_back:
            self.alloc_tmp(out + ".fp32", F * self.x.d)
            r.free(out)
            r.rename(out + ".fp32", out)
        if sum_into:  # autograd adds the input gradient into the running sum before the weight cast
            self.sum_grads(sum_into, out)
        if c != p:
            r.alloc(f"wg32.{name}", "temporaries", p * elements)
            r.free(f"wg.{name}")
            r.rename(f"wg32.{name}", f"wg.{name}")
        r.free(f"wg.{name}")
        if keep_as is not None:  # a tied head's gradient waits for the embedding's
            r.alloc(keep_as, "temporaries", p * elements)
        else:
            self.keep_grad(name, elements)

    def sum_grads(self, total: str, part: str) -> None:
        """Autograd adds a new gradient contribution into a fresh buffer."""
        if not self.r.is_live(total):
            self.r.rename(part, total)
            return
        self.alloc_tmp(total + ".sum", self.x.p * self.x.d)
        self.r.free(total, part)
        self.r.rename(total + ".sum", total)

    def norm_backward(
        self, k: int | None, label: str, *, widest: float, early: tuple[str, ...], late: tuple[str, ...]
    ) -> None:
        """A norm's backward: `early` saved tensors are released by its first ops; then elementwise
        fp32 math at most `widest` (tokens, d) fp32 buffers wide; then `late` ones go and its input
        gradient joins the residual stream's gradient."""
        self.r.moment = f"backward: block {k} {label} norm" if k is not None else "backward: final norm"
        self.r.free("g.y", *early)
        self.alloc_tmp("g.norm", widest * F * self.x.d)
        self.r.free("g.norm", *late)
        self.alloc_tmp("g.x", self.x.p * self.x.d)
        self.sum_grads("g.res", "g.x")

    def keep_grad(self, name: str, elements: int) -> None:
        if not self.held:  # with held gradients the new one is added in place and freed
            self.r.alloc(f"grad.{name}", "gradients", self.x.p * elements / self.setting.shards)

    # -- static --------------------------------------------------------------------------------
    def static(self) -> None:
        r, desc, p, shards = self.r, self.desc, self.x.p, self.setting.shards
        r.moment = "start of step"
        r.alloc("params", "parameters", p * desc.num_parameters() / shards)
        states = optimizer_state_bytes(self.setting.optimizer, desc.parameter_tensors(), param_bytes=p)
        r.alloc("opt", "optimizer_states", states / shards)
        if self.held:
            r.alloc("grads.held", "gradients", p * desc.num_parameters() / shards)
        if shards > 1:  # FSDP all-gathers the running block (compute dtype) and prefetches the next
            r.alloc("fsdp.gathered", "temporaries", 2 * self.x.c * desc.block_parameters())

    # -- forward -------------------------------------------------------------------------------
    def forward(self) -> None:
        r, x, desc = self.r, self.x, self.desc
        r.moment = "forward"
        r.alloc("batch", "activations", BATCH_BYTES_PER_TOKEN * self.tokens)
        if desc.family == "llama":  # cos and sin tables: (T, head_dim / 2) fp32 each
            r.alloc("rope", "activations", 2 * self.setting.seq_len * (desc.head_dim // 2) * F)
        if desc.dropout > 0:
            r.alloc("emb.mask", "activations", x.d * self.tokens)
        for k in range(desc.n_layers):
            if self._folded(k):
                if k == 1:
                    self._middle_forward()
                continue
            r.moment = f"forward: block {k}"
            self._alloc_copies(k)
            if self.ckpt:  # the block keeps only its input; its ops' results die as they are used
                r.alloc(f"ckpt.{k}", "activations", x.p * x.d * self.tokens)
            else:
                self._alloc_saved(k)
            r.alloc("fwd.scratch", "activations", FORWARD_SCRATCH_FP32 * F * x.q * self.tokens)
            r.free("fwd.scratch")
        self.forward_head()

    # -- folding: blocks 1 .. L-2 as lumps ---------------------------------------------------------
    # Every block runs the same script; during backward, block k sees activations of blocks 0..k
    # and gradients of blocks k+1..L-1, a base that is linear in k. So the step's highest point over
    # all blocks is reached in the first or the last block, with the same breakdown: the middle
    # blocks are replayed as one lump each way, which makes the replay's cost independent of depth.
    def _folded(self, k: int) -> bool:
        return 0 < k < self.desc.n_layers - 1

    def _middle_forward(self) -> None:
        r, x, m = self.r, self.x, self.desc.n_layers - 2
        r.moment = "forward: middle blocks"
        if self.copy_bytes:
            r.alloc("mid.copies", "weight_copies", m * self.copy_bytes * sum(self.weights.values()))
        if self.ckpt:
            r.alloc("mid.ckpt", "activations", m * x.p * x.d * self.tokens)
        else:
            r.alloc("mid.act", "activations", m * sum(b for _, b in self.saved) * self.tokens)

    def _middle_backward(self) -> None:
        self.r.moment = "backward: middle blocks"
        self.r.free("mid.act", "mid.ckpt", "mid.copies")
        self.keep_grad("mid", (self.desc.n_layers - 2) * self.desc.block_parameters())

    def _alloc_copies(self, k: int) -> None:
        """Autocast's cached low-precision weights, one per block Linear."""
        if self.copy_bytes:
            for weight, elements in self.weights.items():
                self.r.alloc(f"cp.{k}.{weight}", "weight_copies", self.copy_bytes * elements)

    def _alloc_saved(self, k: int, *, recompute: bool = False) -> None:
        for name, per_token in self.saved:
            if recompute and name == "n1.x" and self.x.p == F:
                continue  # an fp32 block input is saved as itself: it is the checkpoint's input
            self.r.alloc(f"{k}.{name}", "activations", per_token * self.tokens)

    def forward_head(self) -> None:
        r, x = self.r, self.x
        r.moment = "forward: final norm and head"
        saved = blocks.rms_saved("f", self) if self.desc.family == "llama" else blocks.ln_saved("f", self)
        for name, per_token in saved:
            r.alloc(name, "activations", per_token * self.tokens)
        if x.auto:
            r.alloc("h.in", "activations", x.c * x.d * self.tokens)
            r.alloc("cp.head", "weight_copies", x.c * x.vocab * x.d)
        r.moment = "forward: logits and loss"
        self.alloc_tmp("h.logits", x.c * x.vocab)  # the training loop holds logits to the step's end
        if x.c != F:
            self.alloc_tmp("h.logits32", F * x.vocab)  # the loss upcasts logits to fp32
        self.alloc_tmp("h.logprobs", F * x.vocab)
        r.free("h.logits32")
        if self.ckpt:  # autocast's weight cache dies with the forward context; nothing saved them
            r.free("mid.copies")
            for k in range(self.desc.n_layers):
                r.free_prefix(f"cp.{k}.")

    # -- backward ------------------------------------------------------------------------------
    def backward(self) -> None:
        self.backward_head()
        for k in reversed(range(self.desc.n_layers)):
            if self._folded(k):
                if k == self.desc.n_layers - 2:
                    self._middle_backward()
                continue
            if self.ckpt:
                self.r.moment = f"backward: block {k} recompute"
                self._alloc_copies(k)
                self._alloc_saved(k, recompute=True)
            self.block_backward(self, k)
            self.r.free(f"ckpt.{k}")
            self.keep_grad(f"{k}.vectors", self.desc.block_parameters() - sum(self.weights.values()))
        self.backward_embedding()

    def backward_head(self) -> None:
        r, x = self.r, self.x
        r.moment = "backward: loss"
        self.alloc_tmp("g.nll", F * x.vocab)
        self.alloc_tmp("g.logits", F * x.vocab)
        r.free("g.nll", "h.logprobs")
        if x.c != F:
            r.moment = "backward: logits cast"
            self.alloc_tmp("g.logits.c", x.c * x.vocab)
            r.free("g.logits")
            r.rename("g.logits.c", "g.logits")
        r.moment = "backward: output head"
        self.linear(
            "head",
            x.vocab * x.d,
            g_out="g.logits",
            in_bytes=x.c * x.d,
            cast_back=x.auto,
            frees=("h.in", "f.y"),
            out="g.y",
            keep_as="tied.grad" if self.desc.tie_embeddings else None,
        )
        # one buffer wider than in a block, where the first fp32 partial gradient is added into
        # the residual gradient's buffer early; here there is no residual gradient yet
        widest = (blocks.RMS_WIDEST if self.desc.family == "llama" else blocks.LN_WIDEST) + 1
        early = ("f.rstd", "f.normed") if self.desc.family == "llama" else ()
        self.norm_backward(None, "final", widest=widest, early=early, late=("f.x", "f.rstd", "f.normed", "f.stats"))
        self.keep_grad("final.vectors", self.desc.final_norm_parameters())

    def backward_embedding(self) -> None:
        r, x, desc, p = self.r, self.x, self.desc, self.x.p
        r.moment = "backward: embedding"
        r.free("rope", "emb.mask")  # last used by block 0; the batch itself lives to the step's end
        r.alloc("g.emb", "temporaries", p * x.vocab * x.d)  # the dense embedding gradient
        r.free("g.res")  # its last use
        if desc.tie_embeddings:
            r.alloc("g.emb.sum", "temporaries", p * x.vocab * x.d)  # + the head's, into a new buffer
        r.free("g.emb", "tied.grad", "g.emb.sum")
        self.keep_grad("embed", x.vocab * x.d)
        if desc.position_rows:
            r.alloc("g.pos", "temporaries", p * desc.position_rows * x.d)
            r.free("g.pos")
            self.keep_grad("positions", desc.position_rows * x.d)

    # -- optimizer -----------------------------------------------------------------------------
    def optimizer_step(self) -> None:
        self.r.moment = "optimizer step"
        self.r.alloc("clip", "temporaries", 8 * len(self.desc.parameter_tensors()))  # per-tensor norms
        self.r.free("clip")


def analytic_ledger(desc: ModelDescription, setting: StepSetting, *, reserve: Reserve = DEFAULT_RESERVE) -> Ledger:
    """The step's memory from formulas (see the module docstring); any model size, microseconds."""
    return replay_ledger(StepReplay(desc, setting).run(), setting, reserve)


def replay_ledger(replay: Replay, setting: StepSetting, reserve: Reserve) -> Ledger:
    """The analytic ledger of a replayed step (the full step's or the LoRA step's): the lines live at
    the replay's peak, each line's largest, and the framework reserve on top of that peak."""
    lines, largest = replay.peak_lines, replay.largest
    return Ledger.of_peak(setting, "analytic", lines=lines, largest=largest, moment=replay.peak_moment, reserve=reserve)
