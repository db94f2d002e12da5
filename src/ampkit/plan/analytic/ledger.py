"""The analytic memory ledger: a training step replayed as byte counts, instant at any size.

`StepReplay` runs the step's script on a `Replay` (named allocations and frees per ledger line),
following what the model's ops allocate and free, in order; the traced engine, which runs the real
step on fake tensors, checks it line by line (tests/plan/analytic/test_ledger.py):

- static: parameters, optimizer states, and (with gradient accumulation > 1) the gradients held
  from earlier micro-batches; fp32 master weights are a line of their own and are 0 in every
  ampkit regime (mixed precision's fp32 parameters *are* the master copy; bf16-true keeps none);
- forward: per block, the tensors autograd saves for backward (`blocks.llama_saved` /
  `blocks.gpt_saved`, with their dtypes) and autocast's low-precision weight copies; then the
  logits, which the loss saves, and its fp32 math a chunk of rows at a time (`ampkit.models.loss`:
  no B*T*V fp32 log-probabilities);
- backward: the loss (the logits' gradient in their dtype, chunk by chunk; then the saved logits
  go: the loop itself dropped them before backward) and head, then each block in reverse
  (`blocks.llama_backward` / `blocks.gpt_backward`): each Linear's two matmuls, the release of
  what it saved, the fp32 cast of an autocast input's gradient, the weight gradient made in the
  compute dtype then cast to the parameter dtype; then the embedding (a dense V x d gradient,
  plus the head's when tied);
- optimizer step: gradients; fused AdamW works in place.
With `checkpointing="full"` a block keeps only its input and its activations come back one block at
a time in backward. Per token, activations differ by regime exactly where the ops do: autocast
saves a low-precision copy of every matmul input *per Linear* and keeps the residual stream, norm
statistics and RoPE in fp32; bf16-true saves fp32 copies only inside RMSNorm.
Blocks 1 .. L-2 are replayed as lumps (see `_folded`): exact, and independent of depth.
"""

from __future__ import annotations

from ampkit.errors import UsageError
from ampkit.models.loss import chunk_rows
from ampkit.plan.analytic import blocks
from ampkit.plan.analytic.dims import Dims, widths_of
from ampkit.plan.analytic.replay import Replay
from ampkit.plan.describe import ModelDescription
from ampkit.plan.numerics import FP32_BYTES, get_numerics
from ampkit.plan.optim import optimizer_state_bytes
from ampkit.plan.setting import DEFAULT_RESERVE, Ledger, Reserve, StepSetting

BATCH_BYTES_PER_TOKEN = 16  # int64 input ids + int64 targets
FORWARD_SCRATCH_FP32 = 2  # short-lived (tokens, q) fp32 buffers inside a block's forward (RoPE)
LOSS_ROW_BYTES = 9  # the loss's per-row target index (int64) and mask (bool), saved for its backward


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
        self.dims = Dims(
            **widths_of(desc),
            param_bytes=self.num.param_bytes,
            compute_bytes=self.num.compute_bytes,
            auto=self.num.autocast,
        )
        self.script = blocks.SCRIPTS[desc.block.script]
        self.saved = self.script.saved(self)
        self.weights = self.script.weights(self)
        self.block_backward = self.script.backward
        # autocast keeps a low-precision copy of each Linear weight; Float8Linear keeps none; under
        # FSDP, MixedPrecisionPolicy's gathered low-precision blocks replace them (see `static`)
        copies = self.dims.auto and not self.num.float8_block_linears and setting.shards == 1
        self.copy_bytes = self.dims.compute_bytes if copies else 0
        self.tokens = setting.tokens
        self.ckpt = setting.checkpointing == "full"
        self.held = setting.grad_accum > 1
        self.replay = Replay()

    def run(self) -> Replay:
        self.static()
        self.forward()
        self.backward()
        self.optimizer_step()
        return self.replay

    # -- helpers the block scripts use ----------------------------------------------------------
    def alloc_tmp(self, name: str, per_token: float) -> None:
        self.replay.alloc(name, "temporaries", per_token * self.tokens)

    def free(self, *names: str | None) -> None:
        self.replay.free(*[n for n in names if n])

    def moment(self, k: int, label: str) -> None:
        self.replay.moment = f"backward: block {k} {label}"

    @staticmethod
    def saved_name(k: int):
        return lambda name: f"{k}.{name}"

    def branch_grad(self) -> str | None:
        """The residual gradient as a branch's output sees it: a compute-dtype copy when the
        residual is wider (mixed precision), else the residual gradient itself (nothing new)."""
        if self.dims.compute_bytes == self.dims.param_bytes:
            return None
        self.alloc_tmp("g.cin", self.dims.compute_bytes * self.dims.d)
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
        replay, c, p = self.replay, self.dims.compute_bytes, self.dims.param_bytes
        if self.num.float8_block_linears and name != "head":
            # eager float8 scaling of the weight: |W|, then W * scale clamped, in fp32, then the fp8
            # copy (torch.compile fuses these away; the plan assumes eager, the larger)
            replay.alloc("f8.scratch", "temporaries", (2 * FP32_BYTES + 1) * elements)
            replay.free("f8.scratch")
        replay.alloc(f"wg.{name}", "temporaries", c * elements)
        self.alloc_tmp(out, in_bytes)
        self.free(g_out, f"cp.{name}", *frees)
        if cast_back:
            self.alloc_tmp(out + ".fp32", FP32_BYTES * self.dims.d)
            replay.free(out)
            replay.rename(out + ".fp32", out)
        if sum_into:  # autograd adds the input gradient into the running sum before the weight cast
            self.sum_grads(sum_into, out)
        if c != p:
            replay.alloc(f"wg32.{name}", "temporaries", p * elements)
            replay.free(f"wg.{name}")
            replay.rename(f"wg32.{name}", f"wg.{name}")
        replay.free(f"wg.{name}")
        if keep_as is not None:  # a tied head's gradient waits for the embedding's
            replay.alloc(keep_as, "temporaries", p * elements)
        else:
            self.keep_grad(name, elements)

    def sum_grads(self, total: str, part: str) -> None:
        """Autograd adds a new gradient contribution into a fresh buffer."""
        if not self.replay.is_live(total):
            self.replay.rename(part, total)
            return
        self.alloc_tmp(total + ".sum", self.dims.param_bytes * self.dims.d)
        self.replay.free(total, part)
        self.replay.rename(total + ".sum", total)

    def norm_backward(
        self, k: int | None, label: str, *, widest: float, early: tuple[str, ...], late: tuple[str, ...]
    ) -> None:
        """A norm's backward: `early` saved tensors are released by its first ops; then elementwise
        fp32 math at most `widest` (tokens, d) fp32 buffers wide; then `late` ones go and its input
        gradient joins the residual stream's gradient."""
        self.replay.moment = f"backward: block {k} {label} norm" if k is not None else "backward: final norm"
        self.replay.free("g.y", *early)
        self.alloc_tmp("g.norm", widest * FP32_BYTES * self.dims.d)
        self.replay.free("g.norm", *late)
        self.alloc_tmp("g.x", self.dims.param_bytes * self.dims.d)
        self.sum_grads("g.res", "g.x")

    def keep_grad(self, name: str, elements: int) -> None:
        if not self.held:  # with held gradients the new one is added in place and freed
            self.replay.alloc(f"grad.{name}", "gradients", self.dims.param_bytes * elements / self.setting.shards)

    # -- static --------------------------------------------------------------------------------
    def static(self) -> None:
        replay, desc, p, shards = self.replay, self.desc, self.dims.param_bytes, self.setting.shards
        replay.moment = "start of step"
        replay.alloc("params", "parameters", p * desc.num_parameters() / shards)
        states = optimizer_state_bytes(self.setting.optimizer, desc.parameter_tensors(), param_bytes=p)
        replay.alloc("opt", "optimizer_states", states / shards)
        if self.held:
            replay.alloc("grads.held", "gradients", p * desc.num_parameters() / shards)
        if shards > 1:  # FSDP all-gathers the running block (compute dtype) and prefetches the next
            replay.alloc("fsdp.gathered", "temporaries", 2 * self.dims.compute_bytes * desc.block_parameters())

    # -- forward -------------------------------------------------------------------------------
    def forward(self) -> None:
        replay, dims, desc = self.replay, self.dims, self.desc
        replay.moment = "forward"
        replay.alloc("batch", "activations", BATCH_BYTES_PER_TOKEN * self.tokens)
        if desc.block.rope:  # cos and sin tables: (T, head_dim / 2) fp32 each
            replay.alloc("rope", "activations", 2 * self.setting.seq_len * (desc.head_dim // 2) * FP32_BYTES)
        if desc.dropout > 0:
            replay.alloc("emb.mask", "activations", dims.d * self.tokens)
        for k in range(desc.n_layers):
            if self._folded(k):
                if k == 1:
                    self._middle_forward()
                continue
            replay.moment = f"forward: block {k}"
            self._alloc_copies(k)
            if self.ckpt:  # the block keeps only its input; its ops' results die as they are used
                replay.alloc(f"ckpt.{k}", "activations", dims.param_bytes * dims.d * self.tokens)
            else:
                self._alloc_saved(k)
            replay.alloc("fwd.scratch", "activations", FORWARD_SCRATCH_FP32 * FP32_BYTES * dims.q * self.tokens)
            replay.free("fwd.scratch")
        self.forward_head()

    # -- folding: blocks 1 .. L-2 as lumps ---------------------------------------------------------
    # Every block runs the same script; during backward, block k sees activations of blocks 0..k
    # and gradients of blocks k+1..L-1, a base that is linear in k. So the step's highest point over
    # all blocks is reached in the first or the last block, with the same breakdown: the middle
    # blocks are replayed as one lump each way, which makes the replay's cost independent of depth.
    def _folded(self, k: int) -> bool:
        return 0 < k < self.desc.n_layers - 1

    def _middle_forward(self) -> None:
        replay, dims, m = self.replay, self.dims, self.desc.n_layers - 2
        replay.moment = "forward: middle blocks"
        if self.copy_bytes:
            replay.alloc("mid.copies", "weight_copies", m * self.copy_bytes * sum(self.weights.values()))
        if self.ckpt:
            replay.alloc("mid.ckpt", "activations", m * dims.param_bytes * dims.d * self.tokens)
        else:
            replay.alloc("mid.act", "activations", m * sum(b for _, b in self.saved) * self.tokens)

    def _middle_backward(self) -> None:
        self.replay.moment = "backward: middle blocks"
        self.replay.free("mid.act", "mid.ckpt", "mid.copies")
        self.keep_grad("mid", (self.desc.n_layers - 2) * self.desc.block_parameters())

    def _alloc_copies(self, k: int) -> None:
        """Autocast's cached low-precision weights, one per block Linear."""
        if self.copy_bytes:
            for weight, elements in self.weights.items():
                self.replay.alloc(f"cp.{k}.{weight}", "weight_copies", self.copy_bytes * elements)

    def _alloc_saved(self, k: int, *, recompute: bool = False) -> None:
        for name, per_token in self.saved:
            if recompute and name == "n1.x" and self.dims.param_bytes == FP32_BYTES:
                continue  # an fp32 block input is saved as itself: it is the checkpoint's input
            self.replay.alloc(f"{k}.{name}", "activations", per_token * self.tokens)

    def forward_head(self) -> None:
        replay, dims = self.replay, self.dims
        replay.moment = "forward: final norm and head"
        saved = self.script.norm_saved("f", self)
        for name, per_token in saved:
            replay.alloc(name, "activations", per_token * self.tokens)
        if dims.auto:
            replay.alloc("h.in", "activations", dims.compute_bytes * dims.d * self.tokens)
            replay.alloc("cp.head", "weight_copies", dims.compute_bytes * dims.vocab * dims.d)
        replay.moment = "forward: logits and loss"
        loss_forward(replay, tokens=self.tokens, vocab=dims.vocab, logits_bytes=dims.compute_bytes)
        if self.ckpt:  # autocast's weight cache dies with the forward context; nothing saved them
            replay.free("mid.copies")
            for k in range(self.desc.n_layers):
                replay.free_prefix(f"cp.{k}.")

    # -- backward ------------------------------------------------------------------------------
    def backward(self) -> None:
        self.backward_head()
        for k in reversed(range(self.desc.n_layers)):
            if self._folded(k):
                if k == self.desc.n_layers - 2:
                    self._middle_backward()
                continue
            if self.ckpt:
                self.replay.moment = f"backward: block {k} recompute"
                self._alloc_copies(k)
                self._alloc_saved(k, recompute=True)
            self.block_backward(self, k)
            self.replay.free(f"ckpt.{k}")
            self.keep_grad(f"{k}.vectors", self.desc.block_parameters() - sum(self.weights.values()))
        self.backward_embedding()

    def backward_head(self) -> None:
        replay, dims = self.replay, self.dims
        replay.moment = "backward: loss"
        loss_backward(replay, tokens=self.tokens, vocab=dims.vocab, logits_bytes=dims.compute_bytes)
        replay.moment = "backward: output head"
        self.linear(
            "head",
            dims.vocab * dims.d,
            g_out="g.logits",
            in_bytes=dims.compute_bytes * dims.d,
            cast_back=dims.auto,
            frees=("h.in", "f.y"),
            out="g.y",
            keep_as="tied.grad" if self.desc.tie_embeddings else None,
        )
        # one buffer wider than in a block, where the first fp32 partial gradient is added into
        # the residual gradient's buffer early; here there is no residual gradient yet
        widest = self.script.norm_widest + 1
        early = self.script.final_early
        self.norm_backward(None, "final", widest=widest, early=early, late=("f.x", "f.rstd", "f.normed", "f.stats"))
        self.keep_grad("final.vectors", self.desc.final_norm_parameters())

    def backward_embedding(self) -> None:
        replay, dims, desc, p = self.replay, self.dims, self.desc, self.dims.param_bytes
        replay.moment = "backward: embedding"
        replay.free("rope", "emb.mask")  # last used by block 0; the batch itself lives to the step's end
        replay.alloc("g.emb", "temporaries", p * dims.vocab * dims.d)  # the dense embedding gradient
        replay.free("g.res")  # its last use
        if desc.tie_embeddings:
            replay.alloc("g.emb.sum", "temporaries", p * dims.vocab * dims.d)  # + the head's, into a new buffer
        replay.free("g.emb", "tied.grad", "g.emb.sum")
        self.keep_grad("embed", dims.vocab * dims.d)
        if desc.position_rows:
            replay.alloc("g.pos", "temporaries", p * desc.position_rows * dims.d)
            replay.free("g.pos")
            self.keep_grad("positions", desc.position_rows * dims.d)

    # -- optimizer -----------------------------------------------------------------------------
    def optimizer_step(self) -> None:
        self.replay.moment = "optimizer step"
        self.replay.alloc("clip", "temporaries", 8 * len(self.desc.parameter_tensors()))  # per-tensor norms
        self.replay.free("clip")


# -- the loss (`ampkit.models.loss`), shared with the LoRA replay ------------------------------------
def loss_forward(replay: Replay, *, tokens: int, vocab: int, logits_bytes: int) -> None:
    """The logits, which the loss saves for its backward, with each row's target index and mask;
    then one chunk of rows at a time, its fp32 log-softmax (from low-precision logits, also the
    fp32 copy it is taken from), each row's picked log-probability kept."""
    replay.alloc("h.logits", "temporaries", logits_bytes * vocab * tokens)
    replay.alloc("ce.rows", "temporaries", LOSS_ROW_BYTES * tokens)
    replay.alloc("ce.picked", "temporaries", FP32_BYTES * tokens)
    replay.alloc("ce.chunk", "temporaries", _loss_chunk_bytes(tokens, vocab, logits_bytes))
    replay.free("ce.chunk", "ce.picked")


def loss_backward(replay: Replay, *, tokens: int, vocab: int, logits_bytes: int) -> None:
    """The logits' gradient, in their dtype, written a chunk at a time from the fp32 softmax (with
    each row's weight and a chunk's column of -1s); then the loss's saved logits and rows go."""
    replay.alloc("ce.weight", "temporaries", FP32_BYTES * (tokens + min(tokens, chunk_rows(tokens, vocab))))
    replay.alloc("g.logits", "temporaries", logits_bytes * vocab * tokens)
    replay.alloc("ce.chunk", "temporaries", _loss_chunk_bytes(tokens, vocab, logits_bytes))
    replay.free("ce.chunk", "ce.weight", "h.logits", "ce.rows")


def _loss_chunk_bytes(tokens: int, vocab: int, logits_bytes: int) -> int:
    """One chunk's fp32 (rows, V) buffers: the (log-)softmax, and the fp32 copy of low-precision logits."""
    buffers = 1 if logits_bytes == FP32_BYTES else 2
    return buffers * FP32_BYTES * vocab * min(tokens, chunk_rows(tokens, vocab))


def analytic_ledger(desc: ModelDescription, setting: StepSetting, *, reserve: Reserve = DEFAULT_RESERVE) -> Ledger:
    """The step's memory from formulas (see the module docstring); any model size, microseconds."""
    return replay_ledger(StepReplay(desc, setting).run(), setting, reserve)


def replay_ledger(replay: Replay, setting: StepSetting, reserve: Reserve) -> Ledger:
    """The analytic ledger of a replayed step (the full step's or the LoRA step's): the lines live at
    the replay's peak, each line's largest, and the framework reserve on top of that peak."""
    lines, largest = replay.peak_lines, replay.largest
    return Ledger.of_peak(setting, "analytic", lines=lines, largest=largest, moment=replay.peak_moment, reserve=reserve)
