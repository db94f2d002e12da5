"""Refuse a run that cannot fit, before building it (`train`, `bench`, `doctor`; `--no-fit-check` skips it).

The planner's analytic ledger gives the training step's peak in microseconds, with no model built;
it is compared with what the device can still give this process:
- An accelerator (CUDA, ROCm, XPU, MPS): the device's free memory (`hardware.backend`'s
  `free_memory_bytes`; on CUDA cudaMemGetInfo, which also creates this process's context, so the
  context is already counted as used); the step needs the ledger's tensor peak plus allocator
  fragmentation plus the workspaces and kernels loaded later (`CUDA_WORKSPACE_BYTES`).
- CPU: the host's available memory (MemAvailable in /proc/meminfo, or the cgroup's limit less its
  usage where that is lower). The ledger counts tensors only; on CPU the process also grows by what
  is not a tensor of the step (oneDNN scratch, autograd bookkeeping, the tokenized corpus, freed
  blocks the allocator keeps), measured here as `CPU_FIXED_BYTES` plus `CPU_DYNAMIC_FACTOR` times the
  step's activations and temporaries (parameters and optimizer states are exact). The estimate of
  the process's peak adds the memory it already holds (interpreter, torch). docs/reliability.md has
  the measurements behind these constants (tiny and small defaults within 25% of the real peak RSS).
Above the capacity: `UsageError` (exit 2) with the estimate, the capacity and the largest
micro-batch that fits. Units: bytes; messages in GiB (1024**3).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch

from ampkit.data.hf_tokenizer import tokenizer_for_model
from ampkit.errors import UsageError
from ampkit.hardware.backend import free_device_memory
from ampkit.models.hf import is_hf_model
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.describe import ModelDescription, describe_model
from ampkit.plan.describe.hf import has_analytic
from ampkit.plan.describe.vlm import VLMDescription
from ampkit.plan.fit import largest
from ampkit.plan.overrides import adjust_weights, kept_parameters
from ampkit.plan.setting import CUDA_CONTEXT_BYTES, FRAGMENTATION, GIB, NO_RESERVE, Ledger, Reserve, StepSetting
from ampkit.precision import ModuleOverrides


class StepPlanner(Protocol):
    """A step's own planner where the analytic ledger is not it (a LoRA run's, an image-text model's)."""

    def ledger(self, setting: StepSetting) -> Ledger: ...

    def largest(self, setting: StepSetting, capacity: int, *, reserve: Reserve) -> int: ...


CPU_FIXED_BYTES = 100 * 1024**2
"""What a CPU run's process grows by beyond the step's tensors, whatever its size (measured ~100 MiB)."""
CPU_DYNAMIC_FACTOR = 1.35
"""Measured peak RSS growth per byte of the ledger's activations and temporaries on CPU (allocator
blocks kept after frees, oneDNN reorders); parameters and optimizer states count once."""
CUDA_WORKSPACE_BYTES = CUDA_CONTEXT_BYTES // 2
"""cuBLAS/cuDNN workspaces and kernels loaded after the context exists (the context itself is
already used memory once `mem_get_info` has run)."""
_STATIC_LINES = ("parameters", "optimizer_states", "master_weights")


@dataclass(frozen=True, kw_only=True)
class FitEstimate:
    """A step's estimated peak against what this device can still give it."""

    peak_bytes: int
    """the estimated peak: the process's resident memory (CPU), or this process's device memory (CUDA)"""
    needed_bytes: int
    """what of it must still come from `capacity_bytes` (CPU: the peak less what the process holds)"""
    capacity_bytes: int
    capacity_label: str
    max_micro_batch: int
    """the largest micro-batch that fits, all else equal (0: not even 1)"""

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.capacity_bytes


def current_rss_bytes() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def host_available_bytes() -> int | None:
    """MemAvailable (/proc/meminfo), or the cgroup v2 limit less its usage when that is lower; None if unknown."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)  # kB in the file means KiB
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _capacity(device: torch.device) -> tuple[int, str] | None:
    if device.type != "cpu":
        index = device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", "0"))
        return free_device_memory(torch.device(device.type, index))
    available = host_available_bytes()
    return None if available is None else (available, "available on this host (MemAvailable)")


def estimate_fit(
    desc: ModelDescription,
    setting: StepSetting,
    device: torch.device,
    *,
    lora: StepPlanner | None = None,
    kept: dict[torch.dtype, int] | None = None,
) -> FitEstimate | None:
    """The step's peak against the device's capacity; None when the capacity is unknown. `lora`: a LoRA
    run's planner (`ampkit.plan.lora.LoraFit`), whose ledger replaces full fine-tuning's. `kept`: the
    parameters module overrides keep in another dtype (`plan.overrides.kept_parameters`), in the weights."""
    found = _capacity(device)
    if found is None:
        return None
    capacity, label = found
    if device.type != "cpu":  # an accelerator's caching allocator
        context, fragmentation, held = CUDA_WORKSPACE_BYTES, FRAGMENTATION, 0
    else:  # every rank of this node needs its share of the host
        capacity //= max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        context, fragmentation, held = CPU_FIXED_BYTES, CPU_DYNAMIC_FACTOR - 1, current_rss_bytes()
    ledger = analytic_ledger(desc, setting, reserve=NO_RESERVE) if lora is None else lora.ledger(setting)
    ledger = adjust_weights(ledger, kept or {})
    static = sum(ledger.at_peak[line] for line in _STATIC_LINES)
    if device.type != "cpu":
        needed = int(ledger.tensor_peak * (1 + fragmentation)) + context
    else:
        needed = static + int(CPU_DYNAMIC_FACTOR * (ledger.tensor_peak - static)) + context
    reserve = Reserve(context_bytes=context, fragmentation=fragmentation)
    if lora is None:
        best = largest(desc, setting, capacity, field="micro_batch", reserve=reserve)
    else:
        best = lora.largest(setting, capacity, reserve=reserve)
    return FitEstimate(
        peak_bytes=held + needed,
        needed_bytes=needed,
        capacity_bytes=capacity,
        capacity_label=label,
        max_micro_batch=best,
    )


def check_fit(
    *,
    model: str,
    precision: str,
    batch_size: int,
    seq_len: int,
    device: torch.device,
    optimizer: str = "adamw",
    grad_accum: int = 1,
    checkpointing: str = "none",
    parallel: str = "none",
    world_size: int = 1,
    vocab_size: int | None = None,
    command: str = "train",
    lora=None,
    overrides: ModuleOverrides | None = None,
    images: dict | None = None,
) -> FitEstimate | None:
    """Refuse (UsageError) a run whose step cannot fit on `device`; returns the estimate (None: not
    checked: a model the planner cannot describe, or a capacity this host does not report). `overrides`:
    the run's per-module precisions (`--keep-fp32`), their weights counted in their own dtype. An `hf:`
    image-text model is checked on the VLM ledger (`plan/vlm`) of `images` (the [model] section's
    `image_args()`: images per sample, image size, frozen parts), its part overrides in their regimes."""
    desc = _describe(model, vocab_size)
    if desc is None or 0 < _longest(desc) < seq_len:
        return None  # the build refuses a sequence longer than the model's with its own message
    setting = StepSetting(
        precision=precision,
        optimizer=optimizer,  # the planner's names are train's
        checkpointing="full" if checkpointing == "full" else "none",  # every-N: bounded by none
        micro_batch=batch_size,
        seq_len=seq_len,
        grad_accum=grad_accum,
        world_size=max(1, world_size),
        parallel=parallel,
    )
    lora_fit: StepPlanner | None = None
    if isinstance(desc, VLMDescription):
        if lora is not None and lora.enabled:
            return None  # a LoRA VLM: no ledger plans it yet
        lora_fit = _VLMFit(desc, setting, images or {}, overrides)
        setting = replace(setting, seq_len=lora_fit.seq_len)
    elif lora is not None and lora.enabled:
        from ampkit.plan.lora.ledger import lora_fit_for  # a LoRA run: its own ledger (None: not one LoRA plans)

        lora_fit = lora_fit_for(desc, lora, setting.precision)
        if lora_fit is None:
            return None
    kept = kept_parameters(desc, overrides) if overrides and lora_fit is None else {}  # a VLM's: its parts
    estimate = estimate_fit(desc, setting, device, lora=lora_fit, kept=kept)
    if estimate is None or estimate.fits:
        return estimate
    raise UsageError(
        _refusal(estimate, model=model, precision=setting.precision, batch_size=batch_size, command=command)
    )


def _describe(model: str, vocab_size: int | None) -> ModelDescription | None:
    try:
        desc = describe_model(model, vocab_size=vocab_size)
    except UsageError:  # a config the planner cannot describe: the build refuses it with its own message
        return None
    if isinstance(desc, VLMDescription):
        return desc  # the VLM ledger replays every image-text family it describes
    return desc if has_analytic(desc) else None  # only the analytic ledger is instant (architectures it replays)


class _VLMFit:
    """An image-text model's step for the fit check: the planner's VLM ledger (`plan/vlm`) of the run's
    images, frozen parts and part overrides, with `estimate_fit`'s planner interface (`ledger`, `largest`).
    Its sequence is the language model's: the run's --seq-len, or (0) what `ampkit plan` takes."""

    def __init__(self, desc: VLMDescription, setting: StepSetting, images: dict, overrides: ModuleOverrides | None):
        from ampkit.plan.overrides import part_precisions
        from ampkit.plan.vlm.planner import resolve_seq_len
        from ampkit.plan.vlm.workload import build_workload

        workload = build_workload(
            desc,
            images=int(images.get("images_per_sample", 1)),
            image_size=str(images.get("image_size", "")),
            freeze=str(images.get("freeze", "")),
            seq_len=setting.seq_len,
        )
        available = {p for p, n in desc.part_parameters.items() if n}
        parts = [o for o in (overrides.items if overrides else ()) if o.pattern in available]
        if parts:  # a part's override in its regime; a deeper module's is not counted (the run takes it)
            workload = replace(
                workload, part_precisions=part_precisions(ModuleOverrides(items=tuple(parts)), available)
            )
        self.desc, self.workload = desc, workload
        self.seq_len = resolve_seq_len(desc, workload, setting.seq_len)

    def ledger(self, setting: StepSetting) -> Ledger:
        from ampkit.plan.vlm.engine import VLMEngine

        return VLMEngine(self.desc, self.workload, reserve=NO_RESERVE).ledger(setting)

    def largest(self, setting: StepSetting, capacity: int, *, reserve: Reserve) -> int:
        from ampkit.plan.vlm.engine import VLMEngine

        return VLMEngine(self.desc, self.workload, reserve=reserve).largest(setting, capacity, field="micro_batch")


def _longest(desc: ModelDescription) -> int:
    """The longest sequence the model takes (0: no limit known)."""
    if desc.max_positions:
        return desc.max_positions
    return desc.model_config.max_seq_len if desc.model_config is not None else 0


def _refusal(estimate: FitEstimate, *, model: str, precision: str, batch_size: int, command: str) -> str:
    gib = lambda n: f"{n / GIB:.2f} GiB"  # noqa: E731
    held = estimate.peak_bytes - estimate.needed_bytes
    peak = f"an estimated {gib(estimate.needed_bytes)}" + (
        f" (beyond the {gib(held)} this process holds)" if held else ""
    )
    if estimate.max_micro_batch >= 1:
        fix = f"the largest micro-batch that fits is --batch-size {estimate.max_micro_batch}"
    else:
        fix = "not even --batch-size 1 fits: shorten --seq-len or pick a smaller --model"
    return (
        f"{command} --model {model} --precision {precision} --batch-size {batch_size} cannot fit: its step needs "
        f"{peak} but only {gib(estimate.capacity_bytes)} is {estimate.capacity_label}; {fix} "
        "(or --grad-accum for the same tokens per step; --no-fit-check skips this check)"
    )


def world_size_for(parallel: str, nproc: int) -> int:
    """A run's data-parallel width: torchrun's WORLD_SIZE once launched, else the processes it will
    start (`--nproc-per-node` x `--nnodes`), 1 without `--parallel`."""
    if parallel == "none":
        return 1
    return int(os.environ.get("WORLD_SIZE", "0")) or nproc or 1


def vocab_size_for(model: str) -> int | None:
    """Presets train on the tokenizer's vocabulary (bytes: 256); an hf: model keeps its own."""
    return None if is_hf_model(model) else tokenizer_for_model(model).vocab_size
