"""Achievable MFU per GPU and precision: public training throughputs, converted to model-FLOPs utilization.

`ampkit plan` times a step as model FLOPs / (the GPU's dense peak for the precision x MFU). One MFU for
every precision predicts the datasheet ratio (bf16 over fp32 is 14.8x on an H100, 16x on an A100), which
a real step does not reach; this table holds what published runs reached, per GPU row of `gpus.py` and
peak key, each row with its source URL.

A row states what was measured -- tokens/s per GPU -- and the model's FLOPs per token in ampkit's own
convention (`plan/analytic/compute.py`: 6N + 12 * layers * q_dim * T, PaLM appendix B; N the parameters
that multiply, the output head included, the embedding not). Its MFU is then

    MFU = tokens/s/GPU (tokens per second) x FLOPs per token (FLOPs) / dense peak (FLOP/s, `GPUS` row)

so the figure stays consistent with the peak table it divides by. Llama-3-8B (32 layers, d_model 4096,
ffn 14336, 8 KV heads of 128, vocabulary 128256) at T = 8192: N = 32 x 218.10M + 525.3M (head) = 7.504e9,
6N = 45.03e9, attention 12 x 32 x 4096 x 8192 = 12.885e9: 57.91e9 FLOPs per token. (torchtitan's own MFU
counts the same way; its quoted figures are given beside each row.)

The fp32 and TF32 rows come from NVIDIA's BERT-Large pre-training tables (PyTorch, phase 1, sequence 128),
the one published training run measured in TF32 or fp32 beside mixed precision on the same GPUs. BERT-Large
(24 layers, d_model 1024, ffn 4096, vocabulary 30522) at T = 128: N = 24 x 12 x 1024^2 = 301.99M (encoder)
+ 32.30M (the MLM head: its d x d transform and the tied d x vocabulary decoder, counted at every position as
ampkit counts a head) = 334.29M, 6N = 2.006e9, attention 12 x 24 x 1024 x 128 = 37.7e6: 2.044e9 FLOPs per
token. (Were the head computed at the ~20 masked positions of 128 only, the count would be 10% lower and
each BERT row's MFU with it; the fp32 : mixed ratio, which is what a plan's step times compare, would not
move.) Tokens/s = sequences/s x 128.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.hardware.gpus import GPUS

LLAMA3_8B_FLOPS_PER_TOKEN = 57.91e9
"""FLOPs per trained token of Llama-3-8B at sequence 8192 (derivation in the module docstring)."""

TORCHTITAN_H100 = "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md"
NVIDIA_BERT = "https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/LanguageModeling/BERT/README.md"
BERT_LARGE_FLOPS_PER_TOKEN = 2.044e9
"""FLOPs per trained token of BERT-Large at sequence 128 (derivation in the module docstring)."""
BERT_SEQ = 128
TORCHTITAN_A100 = (
    "https://github.com/pytorch/torchtitan/blob/041336434916bdc0f88c1f89fda176fd3c2092e4/docs/performance.md"
)


@dataclass(frozen=True, kw_only=True)
class MfuRow:
    """One published training run on one GPU kind in one precision."""

    gpu: str
    """the `GPUS` key whose dense peak divides (`gpus.py`)"""
    peak_key: str
    """the peak column the precision multiplies at (bf16, fp8, ...)"""
    tokens_per_s: float
    """measured training tokens per second per GPU"""
    flops_per_token: float
    """the model's training FLOPs per token, ampkit's convention (FLOPs)"""
    setting: str
    """what ran: model, GPUs, parallelism, batch, checkpointing"""
    source: str
    """URL of the published figure"""
    compiled: bool = False
    """torch.compile on: not the row a plan uses (train's default is eager)"""

    @property
    def mfu(self) -> float:
        """tokens/s x FLOPs/token / the table's dense peak FLOP/s (a fraction, 0..1)."""
        peak = GPUS[self.gpu].peak_flops(self.peak_key)
        assert peak, f"{self.gpu} has no {self.peak_key} peak"
        return self.tokens_per_s * self.flops_per_token / peak


MFU_ROWS: tuple[MfuRow, ...] = (
    MfuRow(
        gpu="H100-80GB",
        peak_key="bf16",
        tokens_per_s=5762,
        flops_per_token=LLAMA3_8B_FLOPS_PER_TOKEN,
        setting="torchtitan Llama-3.1-8B, 8 H100 (96 GB HBM2e, 500 W), FSDP, local batch 2, selective AC "
        "(torchtitan quotes 33% MFU)",
        source=TORCHTITAN_H100,
    ),
    MfuRow(
        gpu="H100-80GB",
        peak_key="bf16",
        tokens_per_s=6667,
        flops_per_token=LLAMA3_8B_FLOPS_PER_TOKEN,
        setting="the same with torch.compile (torchtitan quotes 39% MFU)",
        source=TORCHTITAN_H100,
        compiled=True,
    ),
    MfuRow(
        gpu="H100-80GB",
        peak_key="fp8",
        tokens_per_s=8532,
        flops_per_token=LLAMA3_8B_FLOPS_PER_TOKEN,
        setting="the same with torch.compile and float8 Linears (torchao; MFU against the fp8 peak)",
        source=TORCHTITAN_H100,
    ),
    MfuRow(
        gpu="A100-80GB",
        peak_key="bf16",
        tokens_per_s=2973,
        flops_per_token=LLAMA3_8B_FLOPS_PER_TOKEN,
        setting="torchtitan Llama-3-8B, 64 A100-80GB, FSDP, local batch 1, selective op AC (torchtitan quotes 58.2%)",
        source=TORCHTITAN_A100,
    ),
    # NVIDIA's BERT-Large, 1 GPU, PyTorch 21.11 NGC container: 317 sequences/s in TF32 on an A100-80GB (580
    # in fp16 mixed precision, 1.83x; that fp16 row is not kept: fp16 reads bf16's torchtitan row above at an
    # equal peak), 50 in fp32 and 224 in fp16 mixed precision on a V100-32GB (4.48x, datasheet 8x).
    MfuRow(
        gpu="A100-80GB",
        peak_key="tf32",
        tokens_per_s=317 * BERT_SEQ,
        flops_per_token=BERT_LARGE_FLOPS_PER_TOKEN,
        setting="NVIDIA BERT-Large pre-training phase 1 (sequence 128), 1 A100-80GB, TF32, batch 128, LAMB",
        source=NVIDIA_BERT,
    ),
    MfuRow(
        gpu="V100-32GB",
        peak_key="fp32",
        tokens_per_s=50 * BERT_SEQ,
        flops_per_token=BERT_LARGE_FLOPS_PER_TOKEN,
        setting="NVIDIA BERT-Large pre-training phase 1 (sequence 128), 1 V100-32GB (DGX-1), fp32, LAMB",
        source=NVIDIA_BERT,
    ),
    MfuRow(
        gpu="V100-32GB",
        peak_key="fp16",
        tokens_per_s=224 * BERT_SEQ,
        flops_per_token=BERT_LARGE_FLOPS_PER_TOKEN,
        setting="the same in fp16 mixed precision (4.48x the fp32 run)",
        source=NVIDIA_BERT,
    ),
)


SAME_RATE = {"fp16": "bf16"}
"""A peak key read from another's row where the card's two peaks are equal (fp16 and bf16 share the tensor
cores' rate on every card of the table that has both)."""


def achievable_mfu(gpu: str, peak_key: str) -> MfuRow | None:
    """The eager (not compiled) row for a `GPUS` key and peak key (fp16: bf16's row at an equal peak), or
    None: no published figure here (the plan then uses one assumed MFU for it: the datasheet's ratio)."""
    key = peak_key
    spec = GPUS.get(gpu)
    if key in SAME_RATE and spec is not None and spec.peak_flops(key) == spec.peak_flops(SAME_RATE[key]):
        key = SAME_RATE[key]
    return next((r for r in MFU_ROWS if r.gpu == gpu and r.peak_key == key and not r.compiled), None)


def sibling_mfu(gpu: str) -> MfuRow | None:
    """The GPU's eager row of its 16-bit tensor-core rate (bf16, else any), for a precision without a row
    of its own: its MFU assumed keeps the datasheet's ratio to that row's precision (no figure is made up)."""
    rows = [r for r in MFU_ROWS if r.gpu == gpu and not r.compiled]
    return next((r for r in rows if r.peak_key == "bf16"), rows[0] if rows else None)
