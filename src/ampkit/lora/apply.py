"""LoRA adapters injected into a built model through peft, in place.

`apply_lora(model, settings, precision=..., seed=...)` on a model whose base weights are real (never
on the meta device: the builder materialises first) and already stored in the base dtype:
1. the targets are resolved (`ampkit.lora.targets`);
2. `--base-dtype nf4`: the targeted Linear layers become bitsandbytes 4-bit layers (`ampkit.lora.nf4`);
3. peft's `inject_adapter_in_model` wraps each target (its path keeps its name: `blocks.0.attn.q_proj`
   holds `base_layer` and `lora_A/lora_B.default`), freezing every other parameter;
4. the adapters are cast to fp32 (what peft's `autocast_adapter_dtype` does: low-precision adapters
   lose small updates to rounding) and initialised from the run seed per parameter name, as the base
   is (`ampkit.models.init`): A uniform in +-1/sqrt(fan_in) (kaiming-uniform, peft's default), B zero,
   so the adapted model starts as the base and the values do not depend on device, dtype or RNG state.
Module paths stay the model's own, so `--inject`, doctor's findings and gradient statistics keep them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.formats import dtype_of
from ampkit.lora.settings import LoraSettings, base_dtype_key
from ampkit.lora.targets import Targets, resolve_targets
from ampkit.models.init import parameter_seed

ADAPTER_NAME = "default"
ADAPTER_MARK = "lora_"
"""peft names every adapter parameter lora_A / lora_B / lora_embedding_A ..."""


def load_peft():
    """Import peft lazily; its absence names the extra to install."""
    for name in ("torchao", "torch.utils._pytree", "bitsandbytes"):  # import-time notices of optional kernels
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import peft
    except ImportError:
        raise UsageError(
            "--lora needs the peft library; install it with pip install 'ampkit[lora]' (or drop --lora)"
        ) from None
    return peft


def storage_dtype(settings: LoraSettings, precision: str) -> torch.dtype:
    """The dtype the base's unquantized weights are stored in (nf4: the precision's compute dtype)."""
    key = settings.resolved_base_dtype(precision)
    return dtype_of(base_dtype_key(precision) if key == "nf4" else key)


@dataclass(frozen=True, kw_only=True)
class LoraInfo:
    """What a LoRA model holds: the summary's "lora" section and the line `ampkit train` prints."""

    settings: LoraSettings
    precision: str
    targets: Targets
    trainable: int
    """parameter elements the optimizer updates (the adapters)"""
    total: int
    """all parameter elements, peft's way (a 4-bit weight counts its unpacked elements)"""
    adapter_dtype: str

    @property
    def base_dtype(self) -> str:
        return self.settings.resolved_base_dtype(self.precision)

    def line(self) -> str:
        share = 100.0 * self.trainable / self.total if self.total else 0.0
        return (
            f"LoRA rank {self.settings.rank} (alpha {self.settings.alpha:g}) on {len(self.targets.paths)} modules, "
            f"{self.targets.source}: {self.trainable:,} trainable of {self.total:,} parameters ({share:.2f}%); "
            f"base frozen in {self.base_dtype}, adapters in {self.adapter_dtype}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.settings.describe(self.precision),
            "targets_source": self.targets.source,
            "adapted_modules": len(self.targets.paths),
            "target_names": self.targets.names(),
            "trainable_parameters": self.trainable,
            "total_parameters": self.total,
            "adapter_dtype": self.adapter_dtype,
        }


def is_adapter(name: str) -> bool:
    return ADAPTER_MARK in name and any(part.startswith(ADAPTER_MARK) for part in name.split("."))


def peft_config(settings: LoraSettings, paths: list[str]):
    """peft's LoraConfig for the resolved target paths."""
    peft = load_peft()
    return peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=list(paths),
        bias="none",
    )


def apply_lora(
    model: nn.Module,
    settings: LoraSettings,
    *,
    precision: str,
    seed: int,
    adapter_dtype: torch.dtype = torch.float32,
) -> LoraInfo:
    """Inject adapters into `model` in place (module docstring); returns what was done.
    `adapter_dtype` other than fp32 is for experiments (the article's fp16 adapters that freeze)."""
    if any(t.is_meta for t in model.parameters()):
        raise RuntimeError("apply_lora needs real base weights: materialise the model first")
    peft = load_peft()
    targets = resolve_targets(model, settings.target_patterns)
    if settings.quantized:
        from ampkit.lora.nf4 import quantize_linears

        quantize_linears(model, targets.paths, compute_dtype=storage_dtype(settings, precision))
    with torch.random.fork_rng(devices=[]):  # peft's own init draws from the global RNG; ours replaces it
        try:
            peft.inject_adapter_in_model(peft_config(settings, targets.paths), model, adapter_name=ADAPTER_NAME)
        except (ValueError, TypeError) as err:
            first = str(err).strip().splitlines()[0][:200]
            raise UsageError(f"peft cannot adapt these --lora-targets ({first}); name Linear layers") from None
    init_adapters(model, seed=seed, dtype=adapter_dtype)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name))  # peft froze the base; nothing else trains
    trainable, total = count_parameters(model)
    return LoraInfo(
        settings=settings,
        precision=precision,
        targets=targets,
        trainable=trainable,
        total=total,
        adapter_dtype=str(adapter_dtype).removeprefix("torch."),
    )


@torch.no_grad()
def init_adapters(model: nn.Module, *, seed: int, dtype: torch.dtype) -> None:
    """Every adapter parameter in `dtype`, drawn per name from `seed` (module docstring)."""
    for module_name, module in list(model.named_modules()):
        for key, param in list(module.named_parameters(recurse=False)):
            name = f"{module_name}.{key}" if module_name else key
            if is_adapter(name):
                value = _adapter_init(name, tuple(param.shape), seed=seed)
                setattr(module, key, nn.Parameter(value.to(device=param.device, dtype=dtype)))


def _adapter_init(name: str, shape: tuple[int, ...], *, seed: int) -> torch.Tensor:
    """fp32 CPU values: lora_A uniform(+-1/sqrt(fan_in)); lora_B zeros; embedding adapters as peft
    (A zeros, B normal); seeded by (seed, name)."""
    generator = torch.Generator(device="cpu").manual_seed(parameter_seed(seed, name))
    if ".lora_A." in name:
        bound = 1.0 / math.sqrt(shape[1]) if len(shape) > 1 and shape[1] else 0.0
        return torch.empty(shape, dtype=torch.float32).uniform_(-bound, bound, generator=generator)
    if ".lora_embedding_B." in name:
        return torch.empty(shape, dtype=torch.float32).normal_(0.0, 1.0, generator=generator)
    return torch.zeros(shape, dtype=torch.float32)


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, all) parameter elements, peft's rule for 4-bit weights (2 per stored byte)."""
    trainable = total = 0
    for param in model.parameters():
        n = param.numel()
        if type(param).__name__ == "Params4bit":
            n *= 2 * param.element_size()
        total += n
        trainable += n if param.requires_grad else 0
    return trainable, total
