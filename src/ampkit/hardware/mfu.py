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
"""

from __future__ import annotations

from dataclasses import dataclass

from ampkit.hardware.gpus import GPUS

LLAMA3_8B_FLOPS_PER_TOKEN = 57.91e9
"""FLOPs per trained token of Llama-3-8B at sequence 8192 (derivation in the module docstring)."""

TORCHTITAN_H100 = "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md"
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
