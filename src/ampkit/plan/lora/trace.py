"""The LoRA step traced on fake tensors, and measured for real on CPU (`ampkit plan --lora --trace`).

The traced model is ampkit's `LlamaLM` built on the meta device, its base cast to the base dtype,
adapters injected by peft exactly as `ampkit train --lora` injects them (fp32, the base frozen), then
materialised as fake tensors and stepped by `Trainer.train_step` (`ampkit.plan.traced.trace.trace_step`).

An nf4 base is traced through `Emulated4bit`, a stand-in for bitsandbytes' `Linear4bit` that holds what
the real layer holds (the packed 4-bit weight, 1 byte per 64-element block of absmax, an fp32 absmax
per 256 blocks: double quantisation, and its code tables) and allocates what bitsandbytes' matmul allocates (the block
scales in fp32, then the weight dequantised to the compute dtype, for the forward and again for the
backward, freed after each matmul; nothing saved but the packed weight). bitsandbytes' own kernels do
not run on fake tensors in a way the tracker can see inside; the real CPU measurement
(`measure_lora_cpu_step_peak`, which runs the real bitsandbytes layers) checks the emulation.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ampkit.lora.apply import ADAPTER_NAME, is_adapter, load_peft, peft_config
from ampkit.models import LlamaLM, build_model
from ampkit.plan.describe import ModelDescription
from ampkit.plan.lora.ledger import NF4_BLOCK, NF4_NESTED_BLOCK, NF4_TABLE_BYTES, LoraPlan, check_lora_plannable
from ampkit.plan.optim import build_optimizer
from ampkit.plan.setting import DEFAULT_RESERVE, Ledger, Reserve, StepSetting
from ampkit.plan.traced.measure import _storage_bytes, profiled_step_peak
from ampkit.plan.traced.trace import _warm_up, random_batch, trace_step, tracker_ledger
from ampkit.plan.traced.tracker import StorageTracker
from ampkit.precision import build_precision


class _Dequantized4bitMatmul(torch.autograd.Function):
    """y = x W^T with W dequantised on the fly (forward and backward), as bitsandbytes' MatMul4Bit."""

    @staticmethod
    def forward(ctx, x, packed, absmax, out_features: int, in_features: int):
        ctx.shape = (out_features, in_features)
        ctx.save_for_backward(packed)  # bitsandbytes keeps only the packed weight for the input gradient
        return F.linear(x, _dequantize(packed, absmax, ctx.shape, x.dtype))

    @staticmethod
    def backward(ctx, grad):
        (packed,) = ctx.saved_tensors
        weight = _dequantize(packed, None, ctx.shape, grad.dtype)
        return grad @ weight, None, None, None, None


def _dequantize(packed: torch.Tensor, absmax, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """The allocations of bitsandbytes' dequantisation: block scales in fp32, then the weight in `dtype`."""
    blocks = math.ceil(shape[0] * shape[1] / NF4_BLOCK)
    scales = torch.empty(blocks, dtype=torch.float32, device=packed.device)
    weight = torch.empty(shape, dtype=dtype, device=packed.device)
    del scales
    return weight


class Emulated4bit(nn.Linear):
    """A 4-bit (nf4, double-quantised) Linear for tracing: bitsandbytes' storage and allocations, no values."""

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype):
        nn.Module.__init__(self)
        self.in_features, self.out_features, self.compute_dtype = linear.in_features, linear.out_features, compute_dtype
        n = self.in_features * self.out_features
        device = linear.weight.device
        self.weight = nn.Parameter(torch.empty((n + 1) // 2, 1, dtype=torch.uint8, device=device), requires_grad=False)
        blocks = math.ceil(n / NF4_BLOCK)
        self.absmax = nn.Parameter(torch.empty(blocks, dtype=torch.uint8, device=device), requires_grad=False)
        nested = math.ceil(blocks / NF4_NESTED_BLOCK)
        self.nested_absmax = nn.Parameter(torch.empty(nested, dtype=torch.float32, device=device), requires_grad=False)
        self.tables = nn.Parameter(torch.empty(NF4_TABLE_BYTES, dtype=torch.uint8, device=device), requires_grad=False)
        self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        y = _Dequantized4bitMatmul.apply(x.to(self.compute_dtype), self.weight, self.absmax, *self._shape)
        return y.to(dtype)

    @property
    def _shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features


def _inject(model: nn.Module, plan: LoraPlan) -> None:
    """peft's adapters on `plan`'s targets, as `ampkit.lora.apply` injects them: fp32, the rest frozen."""
    peft = load_peft()
    paths = plan.paths(model)
    with torch.random.fork_rng(devices=[]):
        peft.inject_adapter_in_model(peft_config(plan.settings, paths), model, adapter_name=ADAPTER_NAME)
    for module_name, module in list(model.named_modules()):
        for key, param in list(module.named_parameters(recurse=False)):
            if is_adapter(f"{module_name}.{key}"):
                setattr(module, key, nn.Parameter(param.detach().to(torch.float32)))
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name))


def lora_meta_model(desc: ModelDescription, plan: LoraPlan) -> LlamaLM:
    """`desc`'s model on the meta device, its base in the plan's dtype (nf4 emulated), adapters injected."""
    check_lora_plannable(desc, plan)
    assert desc.model_config is not None
    with torch.device("meta"):
        model = LlamaLM(desc.model_config)
    model.to(plan.storage_dtype)
    if plan.base_dtype == "nf4":
        modules = dict(model.named_modules())
        for path in plan.paths(model):
            parent, _, name = path.rpartition(".")
            setattr(modules[parent], name, Emulated4bit(modules[path], plan.storage_dtype))
    _inject(model, plan)
    return model


def trace_lora_step(desc: ModelDescription, setting: StepSetting, plan: LoraPlan) -> StorageTracker:
    """One steady-state LoRA step on fake tensors (`ampkit.plan.traced.trace.trace_step` on the adapted model)."""
    with warnings.catch_warnings():
        # the tracer's labels are module backward hooks; block 0's input (the frozen embedding's output)
        # needs no gradient, and torch says so once per block
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        return trace_step(desc, setting, model=lora_meta_model(desc, plan))


def traced_lora_ledger(
    desc: ModelDescription,
    setting: StepSetting,
    plan: LoraPlan,
    *,
    reserve: Reserve = DEFAULT_RESERVE,
) -> Ledger:
    """The LoRA step's memory measured on fake tensors (the same lines as the analytic ledger)."""
    return tracker_ledger(trace_lora_step(desc, setting, plan), setting, reserve)


def _quant_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """bitsandbytes' block statistics and code tables (held outside the parameters)."""
    out: list[torch.Tensor] = []
    for param in model.parameters():
        state: Any = getattr(param, "quant_state", None)
        while state is not None:
            out += [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if torch.is_tensor(t)]
            state = getattr(state, "state2", None)
    return out


def measure_lora_cpu_step_peak(desc: ModelDescription, setting: StepSetting, plan: LoraPlan, *, seed: int = 0) -> int:
    """Bytes at the peak of one real steady-state LoRA training step on CPU: the real peft adapters and,
    for nf4, the real bitsandbytes layers (the method of `ampkit.plan.traced.measure`)."""
    from ampkit.lora.apply import apply_lora

    check_lora_plannable(desc, plan)
    assert desc.model_config is not None
    policy = build_precision(setting.precision, device_type="cpu")
    model = build_model(desc.model_config, seed=seed).to(plan.storage_dtype)
    apply_lora(model, plan.settings, precision=setting.precision, seed=seed)
    optimizer = build_optimizer(setting.optimizer, model)
    _warm_up(model, optimizer, keep_grads=setting.grad_accum > 1)
    batch = random_batch(desc.vocab_size, setting, generator=torch.Generator().manual_seed(seed))
    tensors = [*model.parameters(), *_quant_state_tensors(model), batch.input_ids, batch.targets]
    tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    held = _storage_bytes(tensors)
    return held + profiled_step_peak(model, policy, optimizer, batch)
