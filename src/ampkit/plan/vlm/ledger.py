"""A VLM training step's memory ledger, per part: replayed as byte counts, instant at any size.

The step runs on a `Replay` (the analytic ledger's allocator) part by part, each part's stack of
layers a lump (the causal-LM replay's folding, coarser: a part's layers all alive or all gone):
- static: each part's parameters in its own precision's storage dtype; optimizer states of the
  trained parts only (per tensor, `plan/optim.py`); gradients held across micro-batches with
  `--grad-accum` > 1; under FSDP each divided by the shards, plus two gathered layers;
- forward, in data order: the batch (token ids, targets, pixels); the vision encoder's activations
  (`encoder_tokens` x layers x what one layer saves per token: `plan/analytic/blocks`' scripts, the
  gated RMSNorm one for SwiGLU towers, the LayerNorm one otherwise), the projector's (its Linears'
  inputs per image token, or per cross-attention state for mllama), the language model's over the
  sequence (text + image tokens), mllama's fusion layers (theirs over the text, plus the key/value
  projections of every vision state); autocast's cached low-precision weight copies, for the
  trained parts only (autocast caches the casts of leaves that require grad; a frozen weight is
  recast per use, one at a time); then the logits and the loss (`analytic.ledger.loss_forward`);
- a part saves activations only when it or a part before it trains (`Workload.saves`): a frozen
  vision tower in front of a trained language model keeps none; a frozen language model behind a
  trained projector keeps its own (the gradient passes through it);
- backward, in reverse: the loss, then per part: the head's gradient first (the language model),
  a layer's backward scratch at its widest (`backward_scratch`; with checkpointing, one layer's
  activations rebuilt), then its activations freed and its weight gradients made (trained parts);
  optimizer step: per-tensor norms.
With `--activation-checkpointing full` each layer keeps only its input (the residual stream) and one
layer's activations come back at a time. Within a part, layer k's backward sees the activations of
layers 0..k and the gradients of layers k+1.., a sum linear in k, so its highest point is at the
part's first or last layer: the lump's two ends (the causal-LM replay's folding argument). Hazard:
a part's non-layer tensors (embeddings, the projector) are counted with its layers. Units: bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ampkit.models.hf_vlm import PARTS
from ampkit.plan.analytic import blocks
from ampkit.plan.analytic.dims import Dims
from ampkit.plan.analytic.ledger import BATCH_BYTES_PER_TOKEN, loss_backward, loss_forward
from ampkit.plan.analytic.replay import Replay
from ampkit.plan.describe.vlm import Stack, VLMDescription
from ampkit.plan.numerics import FP32_BYTES, Numerics, get_numerics
from ampkit.plan.optim import optimizer_state_bytes
from ampkit.plan.setting import DEFAULT_RESERVE, Ledger, Reserve, StepSetting
from ampkit.plan.vlm.workload import Workload

ENGINE = "analytic"
PIXEL_CHANNELS = 3


def per_token_saved(stack: Stack, num: Numerics) -> float:
    """Bytes one layer of `stack` saves for backward per token (the analytic block scripts)."""
    dims = Dims(
        d=stack.width,
        q=stack.q_dim,
        kv=stack.kv_dim,
        ff=stack.ff,
        heads=stack.heads,
        vocab=1,
        param_bytes=num.param_bytes,
        compute_bytes=num.compute_bytes,
        auto=num.autocast,
    )
    script = blocks.SCRIPTS["llama" if stack.gated else "gpt"]
    block = SimpleNamespace(fused_qkv=False)  # separate q/k/v projections in every tower and decoder here
    steps: Any = SimpleNamespace(dims=dims, desc=SimpleNamespace(block=block, dropout=0.0))
    saved = sum(b for _, b in script.saved(steps))
    # the scripts have two norms a layer; Gemma has four (and q/k norms over each head), each saving
    # its input and output in fp32 where they compute in fp32 (HF's RMSNorms upcast)
    norm = sum(b for _, b in script.norm_saved("n", steps))
    saved += max(0, stack.norms - 2) * norm
    if stack.qk_norm:
        saved += 2 * FP32_BYTES * (stack.q_dim + stack.kv_dim) + num.compute_bytes * (stack.q_dim + stack.kv_dim)
    return saved


def backward_scratch(stack: Stack, num: Numerics) -> float:
    """Bytes per token a layer's backward holds beyond what it saved, at its widest (the MLP's): the
    gradients of its hidden tensors (gate, up and their product, compute dtype) and two residual-width
    fp32 buffers (the norm's backward)."""
    return 3 * num.compute_bytes * stack.ff + 2 * FP32_BYTES * stack.width


@dataclass(frozen=True, kw_only=True)
class PartLedger:
    """One part's share of the step (bytes), at the step's peak where it says so."""

    part: str
    precision: str
    trained: bool
    saves_activations: bool
    parameters: int
    gradients: int
    """this part's gradients once the backward has made them all"""
    optimizer_states: int
    weight_copies: int
    activations: int
    """what the forward keeps for backward (one micro-batch)"""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class VLMStepReplay:
    """The step script (module docstring) on a `Replay`."""

    def __init__(self, desc: VLMDescription, setting: StepSetting, workload: Workload):
        self.desc, self.setting, self.work = desc, setting, workload
        self.num = {p: get_numerics(workload.precision(p, setting.precision)) for p in PARTS}
        self.b = setting.micro_batch
        self.seq = setting.seq_len
        self.ckpt = setting.checkpointing == "full"
        self.held = setting.grad_accum > 1
        self.replay = Replay()
        self.parts: dict[str, dict[str, int]] = {p: dict.fromkeys(("activations", "copies"), 0) for p in PARTS}

    def run(self) -> Replay:
        self.static()
        self.forward()
        self.backward()
        self.replay.moment = "optimizer step"
        self.replay.alloc("clip", "temporaries", 8 * len(self.desc.parameter_tensors()))
        self.replay.free("clip")
        return self.replay

    # -- sizes -------------------------------------------------------------------------------
    def part_bytes(self, part: str) -> int:
        return self.num[part].param_bytes * self.desc.part_parameters[part] // self.setting.shards

    def state_bytes(self, part: str) -> int:
        if not self.work.trains(part):
            return 0
        tensors = list(self.desc.part_tensors[part])
        states = optimizer_state_bytes(self.setting.optimizer, tensors, param_bytes=self.num[part].param_bytes)
        return states // self.setting.shards

    def matmul_weights(self, part: str) -> int:
        m = self.desc.matmul
        return {
            "vision": m.vision,
            "projector": m.projector_image + m.projector_cross + m.fusion_text,
            "language": m.language,
        }[part]

    def stack_bytes(self, stack: Stack, tokens: int, part: str) -> int:
        """A stack's saved activations over `tokens` (all micro-batch rows), or its checkpoints."""
        num = self.num[part]
        if self.ckpt:  # each layer keeps its input; one layer's activations are rebuilt at a time
            return stack.layers * num.param_bytes * stack.width * tokens
        return int(stack.layers * per_token_saved(stack, num) * tokens)

    # -- the script --------------------------------------------------------------------------
    def static(self) -> None:
        r = self.replay
        r.moment = "start of step"
        for part in PARTS:
            r.alloc(f"params.{part}", "parameters", self.part_bytes(part))
            r.alloc(f"opt.{part}", "optimizer_states", self.state_bytes(part))
            if self.held and self.work.trains(part):
                r.alloc(f"grads.held.{part}", "gradients", self.part_bytes(part))
        if self.setting.shards > 1:  # FSDP gathers the running layer and prefetches the next
            compute = max(n.compute_bytes for n in self.num.values())
            r.alloc("fsdp.gathered", "temporaries", 2 * compute * self.desc.block_parameters())

    def _copies(self, part: str) -> None:
        num = self.num[part]
        if num.autocast and not num.float8_block_linears and self.setting.shards == 1 and self.work.trains(part):
            nbytes = num.compute_bytes * self.matmul_weights(part)
            self.replay.alloc(f"cp.{part}", "weight_copies", nbytes)
            self.parts[part]["copies"] = nbytes

    def _act(self, part: str, name: str, nbytes: float) -> None:
        if self.work.saves(part):
            self.replay.alloc(f"act.{part}.{name}", "activations", nbytes)
            self.parts[part]["activations"] += int(nbytes)

    def forward(self) -> None:
        r, w, b, d = self.replay, self.work, self.b, self.desc
        r.moment = "forward"
        pixel_side = w.cost.resized.height * w.cost.resized.width if w.cost and w.cost.resized else 0
        pixels = w.encoder_passes * PIXEL_CHANNELS * pixel_side * self.num["vision"].param_bytes
        r.alloc("batch", "activations", b * (BATCH_BYTES_PER_TOKEN * self.seq + pixels))
        r.moment = "forward: vision encoder"
        self._copies("vision")
        if w.images:
            self._act("vision", "layers", self.stack_bytes(d.vision, b * w.encoder_tokens, "vision"))
            r.moment = "forward: projector"
            self._copies("projector")
            tokens = w.cross_tokens if d.fusion else w.image_tokens
            width = d.projector_in_features  # each matmul saves its input
            self._act("projector", "in", self.num["projector"].compute_bytes * width * b * tokens)
        else:
            self._copies("projector")
        r.moment = "forward: language model"
        self._copies("language")
        self._act("language", "layers", self.stack_bytes(d.language_stack, b * self.seq, "language"))
        if d.fusion is not None and w.images:
            fusion = self.stack_bytes(d.fusion, b * self.seq, "projector")
            cross = 2 * self.num["projector"].compute_bytes * d.fusion.kv_dim * b * w.cross_tokens * d.fusion.layers
            self._act("projector", "fusion", fusion + cross)
        num = self.num["language"]
        self._act("language", "head", (FP32_BYTES + num.compute_bytes) * d.d_model * b * self.seq)
        r.moment = "forward: logits and loss"
        loss_forward(r, tokens=b * self.seq, vocab=d.vocab_size, logits_bytes=num.compute_bytes)
        if self.ckpt:
            for part in PARTS:
                r.free(f"cp.{part}")  # autocast's cache dies with the forward context

    def backward(self) -> None:
        r, b = self.replay, self.b
        r.moment = "backward: loss"
        loss_backward(
            r, tokens=b * self.seq, vocab=self.desc.vocab_size, logits_bytes=self.num["language"].compute_bytes
        )
        r.free("g.logits")
        stacks = {
            "language": (self.desc.language_stack, b * self.seq),
            "vision": (self.desc.vision, b * self.work.encoder_tokens),
        }
        fusion = self.desc.fusion
        if fusion is not None:
            stacks["projector"] = (fusion, b * self.seq)
        for part in reversed(PARTS):
            if not self.work.saves(part):
                continue
            r.moment = f"backward: {part}"
            grads = self.part_bytes(part) if self.work.trains(part) and not self.held else 0
            first = self.head_grad_bytes() if part == "language" and grads else 0
            r.alloc(f"grads.{part}.first", "gradients", first)  # the head's, made while every activation lives
            stack, tokens = stacks.get(part, (None, 0))
            if stack is not None and tokens:
                r.alloc(f"scratch.{part}", "temporaries", backward_scratch(stack, self.num[part]) * tokens)
            if self.ckpt and stack is not None and tokens:  # one layer's activations rebuilt at a time
                r.alloc(f"recompute.{part}", "activations", per_token_saved(stack, self.num[part]) * tokens)
                r.free(f"recompute.{part}")
            r.free(f"scratch.{part}")
            # layer by layer, activations go as gradients come: the part's highest point is at its start
            # (every activation, the first gradients) or its end (every gradient), so the lump frees first
            r.free_prefix(f"act.{part}.")
            r.free(f"cp.{part}")
            r.alloc(f"grads.{part}", "gradients", grads - first)

    def head_grad_bytes(self) -> int:
        """The output head's weight gradient (the first one backward makes), in the language model's dtype."""
        d = self.desc
        return self.num["language"].param_bytes * d.vocab_size * d.d_model // self.setting.shards

    def part_ledgers(self) -> list[PartLedger]:
        out = []
        for part in PARTS:
            out.append(
                PartLedger(
                    part=part,
                    precision=self.num[part].name,
                    trained=self.work.trains(part),
                    saves_activations=self.work.saves(part),
                    parameters=self.part_bytes(part),
                    gradients=self.part_bytes(part) if self.work.trains(part) else 0,
                    optimizer_states=self.state_bytes(part),
                    weight_copies=self.parts[part]["copies"],
                    activations=self.parts[part]["activations"],
                )
            )
        return out


def vlm_ledger(
    desc: VLMDescription, setting: StepSetting, workload: Workload, *, reserve: Reserve = DEFAULT_RESERVE
) -> tuple[Ledger, list[PartLedger]]:
    """The step's ledger (bytes; the lines at its peak) and each part's share."""
    step = VLMStepReplay(desc, setting, workload)
    replay = step.run()
    ledger = Ledger.of_peak(
        setting, ENGINE, lines=replay.peak_lines, largest=replay.largest, moment=replay.peak_moment, reserve=reserve
    )
    return ledger, step.part_ledgers()
