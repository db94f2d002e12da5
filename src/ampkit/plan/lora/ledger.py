"""The LoRA ledger (`ampkit plan --lora RANK [--base-dtype nf4]`): a LoRA training step replayed as bytes.

What changes from full fine-tuning, line by line:
- parameters: the frozen base in its storage dtype (bf16 under bf16-mixed by default; nf4: the adapted
  Linear layers 4-bit: 0.5 B per weight, plus 1 B per 64-weight block of scales and 4 B per 256 blocks,
  the rest of the base in the compute dtype), plus the adapters, r x (in + out) per adapted Linear, fp32;
- gradients and optimizer states: the adapters' only (fp32; AdamW: two fp32 states per element);
- weight copies: autocast's bf16 copies of the fp32 adapters (and of an fp32 base's weights);
- activations: what the adapters' backward still needs (each adapter's low-precision input and its
  rank-r middle), plus what the frozen base's matmuls need to pass the gradient on (their weights, not
  their inputs: a frozen weight needs no input saved) and the norms, attention and activation functions
  as in full fine-tuning; the residual stream is in the base's dtype (the embedding is frozen in it);
- temporaries: the base's input gradients, the adapters' gradients and their casts; an nf4 base adds one
  layer's dequantised weight at a time (forward and backward).
The replay follows the ops of `ampkit.models.llama` with peft's `lora.Linear` (checked against the
traced step, `ampkit.plan.lora.trace`, and a real CPU step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.lora.settings import LoraSettings
from ampkit.lora.targets import LLAMA_PROJECTIONS
from ampkit.plan.analytic.dims import widths_of
from ampkit.plan.analytic.ledger import replay_ledger
from ampkit.plan.describe import ModelDescription
from ampkit.plan.lora.replay import LoraDims, LoraReplay
from ampkit.plan.numerics import FP32_BYTES as FP32
from ampkit.plan.numerics import get_numerics
from ampkit.plan.optim import optimizer_state_bytes
from ampkit.plan.setting import DEFAULT_RESERVE, NO_RESERVE, Ledger, Reserve, StepSetting

NF4_BLOCK = 64
"""weights per 4-bit block (one 8-bit scale each, bitsandbytes' default for nf4)"""
NF4_NESTED_BLOCK = 256
"""8-bit block scales per fp32 second-level scale (double quantisation)"""
BLOCK_WEIGHTS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up"}
BLOCK_WEIGHTS["down_proj"] = "down"


@dataclass(frozen=True, kw_only=True)
class LoraPlan:
    """A planned LoRA run: the settings, resolved for one precision."""

    settings: LoraSettings
    precision: str

    @property
    def rank(self) -> int:
        return self.settings.rank

    @property
    def base_dtype(self) -> str:
        return self.settings.resolved_base_dtype(self.precision)

    @property
    def storage_dtype(self) -> torch.dtype:
        """The unquantised base's dtype (nf4: the compute dtype; also the residual stream's)."""
        from ampkit.lora.apply import storage_dtype

        return storage_dtype(self.settings, self.precision)

    @property
    def targets(self) -> list[str]:
        """The adapted projections of a block (q_proj, ...), in block order."""
        patterns = self.settings.target_patterns or list(LLAMA_PROJECTIONS)
        unknown = [p for p in patterns if p not in BLOCK_WEIGHTS]
        if unknown:
            raise UsageError(
                f"plan --lora-targets {unknown[0]!r}: the planner adapts a Llama block's projections by name: "
                f"{', '.join(LLAMA_PROJECTIONS)}"
            )
        return [p for p in LLAMA_PROJECTIONS if p in patterns]

    def paths(self, model: nn.Module) -> list[str]:
        """The adapted modules' paths in an ampkit `LlamaLM`."""
        return [
            n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in self.targets
        ]

    def describe(self) -> dict:
        return {**self.settings.describe(self.precision), "targets": ",".join(self.targets)}


def check_lora_plannable(desc: ModelDescription, plan: LoraPlan) -> None:
    if not desc.block.lora_targets:
        raise UsageError(
            f"plan --lora plans Llama-shaped models (presets; HF llama, mistral, qwen2 configs), and {desc.name} is "
            f"{desc.family}; plan it without --lora"
        )
    plan.targets  # noqa: B018 - validates the names


NF4_TABLE_BYTES = 4 * 16 + 4 * 256 + 4
"""per quantised layer: the 16-value nf4 code, the 256-value code of the 8-bit scales, their fp32 offset"""


def nf4_bytes(elements: int) -> int:
    """Bytes of a double-quantised nf4 weight of `elements`: the packed weight (2 per byte), an 8-bit scale
    per 64-weight block, an fp32 scale per 256 blocks, and the layer's code tables."""
    blocks = math.ceil(elements / NF4_BLOCK)
    return (elements + 1) // 2 + blocks + 4 * math.ceil(blocks / NF4_NESTED_BLOCK) + NF4_TABLE_BYTES


# ---------------------------------------------------------------- the analytic replay

ATTN = ("q_proj", "k_proj", "v_proj")
MLP_IN = ("gate_proj", "up_proj")


def lora_dims(desc: ModelDescription, setting: StepSetting, plan: LoraPlan) -> LoraDims:
    num = get_numerics(setting.precision)
    if num.param_bytes != 4 or num.float8_block_linears:
        raise UsageError(
            f"plan --lora plans fp32, tf32, bf16-mixed and fp16-mixed (the base dtype is --base-dtype), not "
            f"{setting.precision}; plan bf16-mixed for a bf16 base"
        )
    s = torch.empty((), dtype=plan.storage_dtype).element_size()
    return LoraDims(
        **widths_of(desc),
        rank=plan.rank,
        storage_bytes=s,
        compute_bytes=num.compute_bytes if num.autocast else s,
        auto=num.autocast,
        nf4=plan.base_dtype == "nf4",
    )


def adapter_tensors(desc: ModelDescription, dims: LoraDims, plan: LoraPlan) -> list[int]:
    """Element counts of every adapter tensor (lora_A, lora_B per adapted projection per block)."""
    widths = dims.widths()
    per_block = [n for t in plan.targets for n in (dims.rank * widths[t][0], widths[t][1] * dims.rank)]
    return per_block * desc.n_layers


def base_bytes(desc: ModelDescription, dims: LoraDims, plan: LoraPlan) -> int:
    """The frozen base: adapted projections in the base dtype (or nf4), everything else in the stream dtype."""
    widths = dims.widths()
    adapted = [widths[t][0] * widths[t][1] for t in plan.targets] * desc.n_layers
    rest = desc.num_parameters() - sum(adapted)
    quantized = sum(nf4_bytes(n) for n in adapted) if dims.nf4 else dims.storage_bytes * sum(adapted)
    return dims.storage_bytes * rest + quantized


def static_lines(desc: ModelDescription, setting: StepSetting, dims: LoraDims, plan: LoraPlan) -> dict[str, int]:
    adapters = adapter_tensors(desc, dims, plan)
    lines = {
        "parameters": base_bytes(desc, dims, plan) + FP32 * sum(adapters),
        "optimizer_states": optimizer_state_bytes(setting.optimizer, adapters, param_bytes=FP32),
    }
    if setting.grad_accum > 1:
        lines["gradients"] = FP32 * sum(adapters)
    return lines


def analytic_lora_ledger(
    desc: ModelDescription,
    setting: StepSetting,
    plan: LoraPlan,
    *,
    reserve: Reserve = DEFAULT_RESERVE,
) -> Ledger:
    """The LoRA step's memory from formulas (`ampkit.plan.lora.replay`); any model size, milliseconds."""
    check_lora_plannable(desc, plan)
    if setting.shards > 1:
        raise UsageError("plan --lora plans one process (LoRA runs are not sharded); drop --parallel fsdp")
    dims = lora_dims(desc, setting, plan)
    replay = LoraReplay(
        dims,
        n_layers=desc.n_layers,
        tokens=setting.tokens,
        seq_len=setting.seq_len,
        head_dim=desc.head_dim,
        static=static_lines(desc, setting, dims, plan),
        ckpt=setting.checkpointing == "full",
    )
    replay.adapted = set(plan.targets)
    return replay_ledger(replay.run(), setting, reserve)


def lora_largest(
    desc: ModelDescription,
    setting: StepSetting,
    plan: LoraPlan,
    capacity: int,
    *,
    field: str = "micro_batch",
    reserve: Reserve = DEFAULT_RESERVE,
    limit: int = 1 << 20,
) -> int:
    """Largest micro-batch (or sequence length) whose LoRA step fits `capacity` (0: not even 1).
    Memory grows with either, so a doubling then a bisection finds it (each probe: one replay)."""

    def fits(value: int) -> bool:
        probe = replace(setting, micro_batch=value) if field == "micro_batch" else replace(setting, seq_len=value)
        ledger = analytic_lora_ledger(desc, probe, plan, reserve=reserve)
        return ledger.total <= capacity

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


@dataclass(frozen=True)
class LoraFit:
    """The LoRA ledger for the pre-build fit check (`ampkit.plan.fit_check`)."""

    desc: ModelDescription
    plan: LoraPlan

    def ledger(self, setting: StepSetting) -> Ledger:
        return analytic_lora_ledger(self.desc, setting, self.plan, reserve=NO_RESERVE)

    def largest(self, setting: StepSetting, capacity: int, *, reserve: Reserve) -> int:
        return lora_largest(self.desc, setting, self.plan, capacity, reserve=reserve)


def lora_fit_for(desc: ModelDescription, settings: LoraSettings, precision: str) -> LoraFit | None:
    """A LoRA run's fit planner, or None where the LoRA ledger does not plan it (not checked then)."""
    plan = LoraPlan(settings=settings, precision=precision)
    try:
        check_lora_plannable(desc, plan)
        lora_dims(desc, StepSetting(precision=precision), plan)
    except UsageError:
        return None
    return LoraFit(desc=desc, plan=plan)
