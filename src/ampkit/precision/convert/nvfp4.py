"""NVFP4: torchao's NVFP4 training matmul on sm100, quantize-dequantize emulation elsewhere.

NVFP4 stores e2m1 elements in blocks of 16 under an e4m3 scale, with one fp32 scale per tensor.
torchao 0.18 ships a training recipe (`prototype.moe_training.nvfp4_training`: `NVFP4TrainingConfig`,
`NVFP4Linear`, the autograd Function behind `nvfp4_linear`): 16x16 weight blocks, a random Hadamard
transform (RHT) on the weight-gradient GEMM's inputs, stochastic rounding of gradients, Triton kernels
only (CUDA; M, K and N multiples of 128). `nvfp4` calls that function from a Linear of ampkit's own:
- the RHT sign vector is one fixed vector for every layer (`RHT_SIGNS`, drawn once from seed 0), so
  replicas and resumed runs agree without a buffer;
- the stochastic-rounding seed of each layer is a constant derived from its module name, and the
  per-step offsets come from the CUDA generator, whose state ampkit's checkpoints hold: a resumed run
  draws what the uninterrupted one would have. (torchao's own NVFP4Linear keeps both in buffers, which
  a model built on the meta device, as `ampkit train` builds it, would leave uninitialised.)
- the token count is padded to a multiple of 128 with zero rows (cut off again from the output).
`nvfp4-emulated` rounds each GEMM's inputs to NVFP4 with 1x16 blocks and round-to-nearest
(`convert/qdq.py`): the plain format's fidelity on any device, not the full recipe's and not its speed.
"""

from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.precision.convert.base import LinearConverter, adopt_linear, replace_module
from ampkit.precision.convert.loading import load_torchao
from ampkit.precision.convert.qdq import QDQLinear

TRITON_MULTIPLE = 128  # torchao's NVFP4 Triton kernels: M, K and N multiples of 128
RHT_SIGNS = tuple(int(s) for s in (torch.rand(16, generator=torch.Generator().manual_seed(0)) >= 0.5) * 2 - 1)
"""the {-1, +1} sign vector of the 16-point random Hadamard transform, one for the whole model"""


class NVFP4Linear(nn.Linear):
    """An nn.Linear whose three GEMMs run in NVFP4 through torchao's `nvfp4_linear` (sm100, Triton)."""

    sr_seed: int = 0
    """the layer's stochastic-rounding key (from its module name: `_seed_of`)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = load_torchao("prototype.moe_training.nvfp4_training.nvfp4_linear", what="nvfp4")
        kernels = load_torchao("quantization.quantize_.common", what="nvfp4").KernelPreference
        rows = x.reshape(-1, self.in_features)
        tokens = rows.shape[0]
        pad = (-tokens) % TRITON_MULTIPLE
        if pad:
            rows = F.pad(rows, (0, 0, 0, pad))
        seed = torch.tensor([self.sr_seed], dtype=torch.int64, device=rows.device)
        out = linear.nvfp4_linear(
            rows, self.weight, None, sign_vector=RHT_SIGNS, kernel_preference=kernels.TRITON, sr_seed=seed
        )
        out = (out[:tokens] if pad else out).reshape(*x.shape[:-1], self.out_features)
        return out + self.bias.to(out.dtype) if self.bias is not None else out


def _seed_of(fqn: str) -> int:
    """A stable int64 key per module name (the same on every rank and after a resume)."""
    return zlib.crc32(fqn.encode()) - 2**31


class NVFP4Converter(LinearConverter):
    format_name = "nvfp4"

    def shape_reason(self, fqn: str, module: nn.Linear) -> str | None:
        why = super().shape_reason(fqn, module)
        dims = (module.in_features, module.out_features)
        if why is None and not self.emulated and any(d % TRITON_MULTIPLE for d in dims):
            return f"{dims[0]}x{dims[1]} not multiples of {TRITON_MULTIPLE} (torchao's NVFP4 kernels)"
        return why

    def guards_outputs(self) -> bool:
        return not self.emulated  # torchao's Function returns a view; the emulation a tensor of its own

    def swap(self, model: nn.Module, names: list[str]) -> None:
        for fqn in names:
            old = model.get_submodule(fqn)
            if self.emulated:
                new = adopt_linear(QDQLinear, old, format_name="nvfp4")
            else:
                new = adopt_linear(NVFP4Linear, old, sr_seed=_seed_of(fqn))
            replace_module(model, fqn, new)
