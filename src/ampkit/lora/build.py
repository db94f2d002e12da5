"""The LoRA model of a run: the task's base built directly in its storage dtype, then adapted.

Order (train's `build_run_model`, doctor's fresh models and `ampkit train --export` all use it):
1. the task's model inside `default_dtype(storage dtype)`: on the meta device where the task allows
   (the built-in presets), so the base is never allocated in fp32 when it is stored in bf16/fp16;
2. `materialize` (to_empty + the seeded init: the same values a full fine-tune starts from, rounded to
   the storage dtype), then a cast for models a task builds in fp32 whatever the default dtype;
3. `apply_lora`: nf4 quantisation of the targets, peft's adapters (fp32, seeded), the base frozen.
Adapters are added after materialisation because peft needs real modules to wrap and the seeded
init names parameters by path; sharding (FSDP2) would have to come after them, and LoRA runs are
one-process runs (`check_lora_run`).
"""

from __future__ import annotations

import torch
from torch import nn

from ampkit.formats import dtype_of
from ampkit.lora.apply import LoraInfo, apply_lora, load_peft, storage_dtype
from ampkit.lora.settings import LoraSettings, base_dtype_key
from ampkit.models.init import materialize
from ampkit.precision.base import default_dtype
from ampkit.tasks import optional


def check_lora_available(settings: LoraSettings, *, device: torch.device, precision: str) -> None:
    """Before any data or model work: peft importable; nf4 runs on this device (UsageError with the fix)."""
    if not settings.enabled:
        return
    load_peft()
    if settings.quantized:
        from ampkit.lora.nf4 import check_nf4_supported

        check_nf4_supported(device, dtype_of(base_dtype_key(precision)))


def build_lora_model(
    task, settings: LoraSettings, *, precision: str, device: torch.device, seed: int
) -> tuple[nn.Module, LoraInfo]:
    """The task's model with LoRA adapters on `device` (module docstring)."""
    dtype = storage_dtype(settings, precision)
    with default_dtype(dtype):
        model = task.build_model(device=torch.device("meta") if optional.meta_init(task) else device, seed=seed)
    model = materialize(model, device=device, seed=seed)
    model.to(device=device, dtype=dtype)
    return model, apply_lora(model, settings, precision=precision, seed=seed)
