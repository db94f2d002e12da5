"""The step outside the Linears' GEMMs, the part no format speeds up (Amdahl's serial share).

Estimated on the same roofline (`ampkit.hardware.roofline`), per micro-batch of M tokens at context T,
every kernel at the table's peak or bandwidth, bf16 activations (2 bytes an element):
    attention   the score and value products, 12 x layers x q_dim x T FLOPs a token for forward and
                backward (PaLM's appendix B, as `plan.analytic.compute` counts them), at the bf16 peak
                (flash attention is compute-bound); ampkit's converters never convert them
    elementwise per block and token the forward reads and writes: 2 norms (d in, d out: 4d), 2
                residual adds (2d in, d out: 6d), RoPE on q and k (2(q + kv); none without RoPE), the
                MLP's activation (a gated one reads 2 ff and writes ff: 3 ff; else 2 ff); backward
                moves twice the forward's bytes (saved input and output gradient in, input gradient
                out): 3x in all
    loss        cross-entropy over M x vocab logits: ~16 bytes a logit (bf16 in, fp32 softmax out and
                read back, its gradient written)
    weights     autocast's per-micro-batch cast of the fp32 weights to bf16 (read 4, write 2 bytes a
                parameter), paid by bf16 and every low-bit format alike
    optimizer   AdamW, fp32: read weight, gradient and two moments (16 bytes), write three (12): 28 bytes
                a parameter, once per optimizer step (amortized over the micro-batches of one); under
                FSDP each rank casts and steps its shard only (both divided by the shards)
Not counted: the embedding lookup, dropout, data-parallel communication (a gradient all-reduce hides
behind backward when it can) and launch overheads. Units: seconds, FLOPs, bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ampkit.hardware.roofline import BASELINE, HP_BYTES, Roofline
from ampkit.plan.describe import ModelDescription

ATTENTION_FLOPS_PER_TOKEN_PER_DIM = 12  # x layers x q_dim x T: forward + backward of QK^T and AV
BACKWARD_TRAFFIC = 2  # backward moves ~twice the forward's elementwise bytes
LOSS_BYTES_PER_LOGIT = 16
WEIGHT_CAST_BYTES = 4 + 2  # fp32 read, bf16 written, per parameter per micro-batch
ADAMW_BYTES = 16 + 12  # per parameter per optimizer step


@dataclass(frozen=True, kw_only=True)
class OtherTime:
    """Seconds of one micro-batch's step outside the Linears, by part."""

    attention_s: float
    elementwise_s: float
    loss_s: float
    weights_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return self.attention_s + self.elementwise_s + self.loss_s + self.weights_s + self.optimizer_s

    def to_dict(self) -> dict:
        return {**asdict(self), "total_s": self.total_s}


def elementwise_elements_per_token(desc: ModelDescription) -> int:
    """Elements one block's forward reads and writes a token outside its GEMMs (module docstring)."""
    d, ff = desc.d_model, desc.d_ff
    rope = 2 * (desc.q_dim + desc.kv_dim) if desc.block.rope else 0
    activation = 3 * ff if desc.block.gated_mlp else 2 * ff
    return 4 * d + 6 * d + rope + activation


def other_time(
    desc: ModelDescription, *, micro_batch: int, seq_len: int, grad_accum: int, device: Roofline, shards: int = 1
) -> OtherTime:
    """One micro-batch's non-GEMM time on `device` (its bf16 peak and bandwidth)."""
    tokens = micro_batch * seq_len
    peak = device.peak(BASELINE)
    if peak is None:
        raise ValueError(f"no bf16 peak on {device.name or 'this device'}")
    attention_flops = ATTENTION_FLOPS_PER_TOKEN_PER_DIM * desc.n_layers * desc.q_dim * seq_len * tokens
    elementwise = (1 + BACKWARD_TRAFFIC) * elementwise_elements_per_token(desc) * HP_BYTES * tokens * desc.n_layers
    params = desc.num_parameters() / shards  # each rank's share (FSDP); all of them otherwise
    return OtherTime(
        attention_s=attention_flops / peak,
        elementwise_s=elementwise / device.bandwidth,
        loss_s=LOSS_BYTES_PER_LOGIT * tokens * desc.vocab_size / device.bandwidth,
        weights_s=WEIGHT_CAST_BYTES * params / device.bandwidth,
        optimizer_s=ADAMW_BYTES * params / grad_accum / device.bandwidth,
    )
