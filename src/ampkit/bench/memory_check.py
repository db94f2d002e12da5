"""Will the bench's runs fit, what does the planner predict each step holds, and what batch fits here?

- `check_bench_fits`: each precision's training step, planned by the memory planner's ledger
  (`ampkit.plan.fit_check`), against the device's free memory (CUDA) or the host's available memory
  (CPU), before any worker starts; `--no-fit-check` skips it. A precision that does not fit is refused
  (UsageError, exit 2) with the estimate, the capacity and the largest micro-batch that fits.
- `predict_step_peak`: the planner's prediction of one training step's tensor peak (the analytic
  ledger for a language model, the VLM ledger of `ampkit.plan.vlm` for an `hf:` image-text model;
  the traced ledger of `ampkit.plan.task_plan` for any other task), set
  beside the peak each worker measured on its profiled step (`bench.profile`).
- `largest_batch`: the largest micro-batch the planner says fits this device (the recommendation's
  `ampkit train ... --batch-size N`).
Units: bytes; GiB = 1024**3 bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ampkit.bench.candidates import candidate_overrides, split_candidate
from ampkit.errors import UsageError
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.describe.vlm import VLMDescription
from ampkit.plan.fit_check import (
    CPU_DYNAMIC_FACTOR,
    CPU_FIXED_BYTES,
    CUDA_WORKSPACE_BYTES,
    FitEstimate,
    _capacity,
    _describe,
    check_fit,
    estimate_fit,
    vocab_size_for,
)
from ampkit.plan.overrides import adjust_weights, kept_parameters
from ampkit.plan.setting import FRAGMENTATION, NO_RESERVE, Reserve, StepSetting
from ampkit.precision import ModuleOverrides
from ampkit.precision.overrides import PART_NAMES
from ampkit.tasks.image_text import ImageTextTask
from ampkit.tasks.lm import LanguageModelTask

if TYPE_CHECKING:
    from ampkit.bench.config import BenchConfig
    from ampkit.lora import LoraSettings
    from ampkit.plan.describe import ModelDescription
    from ampkit.plan.lora.ledger import LoraFit
    from ampkit.plan.setting import Ledger
    from ampkit.tasks import Task


def check_bench_fits(config: BenchConfig, precisions: list[str], *, device: torch.device) -> list[FitEstimate]:
    """`config` is a resolved BenchConfig (no "auto" left); returns the estimates, one per precision checked."""
    if not config.fit_check:
        return []
    found = []
    for name in precisions:  # what each worker trains (`bench.worker`): AdamW or the candidate's optimizer
        precision, optimizer = split_candidate(name)
        estimate = check_fit(
            model=config.model.model,
            precision=precision,
            batch_size=config.data.batch_size,
            seq_len=config.data.seq_len,
            device=device,
            optimizer=optimizer or "adamw",
            vocab_size=vocab_size_for(config.model.model),
            command="bench",
            lora=config.lora,  # a LoRA bench: the LoRA ledger (frozen base, adapters' states only)
            overrides=_overrides(config, name),
            images=config.model.image_args(),  # an hf: VLM: its images and frozen parts
        )
        if estimate is not None:
            found.append(estimate)
    return found


def _setting(name: str, batch_size: int, seq_len: int) -> StepSetting:
    """The planner's step of candidate `name` (a precision, or 'bf16-true+adamw-sr')."""
    precision, optimizer = split_candidate(name)
    return StepSetting(
        precision=precision, optimizer=optimizer or "adamw", micro_batch=batch_size, seq_len=max(1, seq_len)
    )


def predict_step_peak(
    config: BenchConfig, task: Task, precision: str, *, batch_size: int, seq_len: int | None = None
) -> dict[str, Any]:
    """{"bytes", "source", "note"}: the planner's tensor peak of one step at this batch (no framework
    reserve: what the allocator holds), or bytes None with why it is not predicted."""
    try:
        if isinstance(task, LanguageModelTask):
            desc = _describe(config.model.model, vocab_size_for(config.model.model))
            if desc is None:
                return {
                    "bytes": None,
                    "source": None,
                    "note": "not predicted: the planner does not describe this model",
                }
            setting = _setting(precision, batch_size, seq_len or config.data.seq_len)
            kept = kept_parameters(desc, _overrides(config, precision))  # module overrides' weights in their dtype
            ledger = adjust_weights(analytic_ledger(desc, setting, reserve=NO_RESERVE), kept)
            return {"bytes": ledger.tensor_peak, "source": "analytic", "note": None}
        if isinstance(task, ImageTextTask):  # a VLM: the planner's per-part ledger (plan/vlm)
            ledger = _vlm_ledger(
                task, precision, batch_size, config.seed, reserve=NO_RESERVE, keep_fp32=config.keep_fp32
            )
            return {"bytes": ledger.tensor_peak, "source": "analytic", "note": None}
        ledger = _task_ledger(task, precision, batch_size, config.seed, reserve=NO_RESERVE)
        return {"bytes": ledger.tensor_peak, "source": "traced", "note": None}
    except Exception as err:
        why = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        return {"bytes": None, "source": None, "note": f"not predicted: {why}"}


def _overrides(config: BenchConfig, name: str) -> ModuleOverrides:
    """What a worker of candidate `name` overrides: the candidate's own, then bench's --keep-fp32."""
    return candidate_overrides(name) + ModuleOverrides.keep_fp32(config.keep_fp32)


def _vlm_ledger(
    task: ImageTextTask, precision: str, batch_size: int, seed: int, *, reserve: Reserve, keep_fp32: str = ""
) -> Ledger:
    """The VLM ledger of the image-text task's step: its images as its data path lays them out, its
    frozen parts, the sequence of its first batch, the parts the candidate (and `keep_fp32`) override
    in their regimes (`plan/overrides.py`; other patterns are not counted here)."""
    from ampkit.plan.describe import describe_model
    from ampkit.plan.vlm.ledger import vlm_ledger
    from ampkit.plan.vlm.workload import Workload

    desc = describe_model(task.model_spec)
    assert isinstance(desc, VLMDescription), "an image-text task's model is a VLM"
    seq_len = task.train_stream(batch_size=batch_size, seed=seed).next_batch().input_ids.shape[1]
    overrides = candidate_overrides(precision) + ModuleOverrides.keep_fp32(keep_fp32)
    parts = {o.pattern: o.regime for o in overrides.items if o.pattern in PART_NAMES}
    workload = Workload(
        images=task.images_per_sample, size=task.size, cost=task.cost, frozen=task.frozen, part_precisions=parts
    )
    return vlm_ledger(desc, _setting(precision, batch_size, seq_len), workload, reserve=reserve)[0]


def _task_ledger(task: Task, precision: str, batch_size: int, seed: int, *, reserve: Reserve) -> Ledger:
    from ampkit.plan.task_plan import task_ledger  # fake-tensor machinery: loaded only for tasks

    batch = task.train_stream(batch_size=batch_size, seed=seed).next_batch()
    setting = _setting(precision, batch_size, 1)
    ledger, _ = task_ledger(task, setting, batch=batch, reserve=reserve)
    return ledger


def largest_batch(config: BenchConfig, task: Task, precision: str, *, device: torch.device) -> dict[str, Any]:
    """{"batch_size", "capacity_bytes", "capacity_label", "source"}: the largest micro-batch whose step
    the planner fits in what this device can give (batch_size None: not predicted, with a "note")."""
    found = _capacity(device)
    if found is None:
        return {"batch_size": None, "note": "this device does not report its free memory"}
    capacity, label = found
    try:
        if isinstance(task, LanguageModelTask):
            desc = _describe(config.model.model, vocab_size_for(config.model.model))
            if desc is None:
                raise UsageError("the planner does not describe this model")
            lora = _lora_fit(desc, config.lora, precision)
            estimate = estimate_fit(
                desc, _setting(precision, config.data.batch_size, config.data.seq_len), device, lora=lora
            )
            best = estimate.max_micro_batch if estimate is not None else None
            source = "analytic"
        else:
            best = _largest_task_batch(config, task, precision, capacity, device)
            source = "analytic" if isinstance(task, ImageTextTask) else "traced"
    except Exception as err:
        return {"batch_size": None, "note": f"not predicted: {str(err).strip()[:160] or type(err).__name__}"}
    return {"batch_size": best, "capacity_bytes": capacity, "capacity_label": label, "source": source}


def _lora_fit(desc: ModelDescription, settings: LoraSettings, name: str) -> LoraFit | None:
    """The LoRA ledger's planner of candidate `name` (None: full fine-tuning); refused where the LoRA
    ledger does not plan this model (a full fine-tuning batch would overstate what fits by far)."""
    if not settings.enabled:
        return None
    from ampkit.plan.lora.ledger import lora_fit_for

    found = lora_fit_for(desc, settings, split_candidate(name)[0])
    if found is None:
        raise UsageError("the LoRA ledger does not plan this model")
    return found


def _largest_task_batch(
    config: BenchConfig, task: Task, precision: str, capacity: int, device: torch.device
) -> int | None:
    """A task's step memory is affine in the batch: traces at b and 2b give the slope."""
    from ampkit.plan.task_plan import _largest_batch

    if device.type != "cpu":  # an accelerator's caching allocator: a workspace and fragmentation
        reserve = Reserve(context_bytes=CUDA_WORKSPACE_BYTES, fragmentation=FRAGMENTATION)
    else:
        reserve = Reserve(context_bytes=CPU_FIXED_BYTES, fragmentation=CPU_DYNAMIC_FACTOR - 1)
    b = config.data.batch_size
    ledger_of = _vlm_ledger if isinstance(task, ImageTextTask) else _task_ledger
    at_b = ledger_of(task, precision, b, config.seed, reserve=reserve).total  # type: ignore[arg-type]
    at_2b = ledger_of(task, precision, 2 * b, config.seed, reserve=reserve).total  # type: ignore[arg-type]
    return _largest_batch(b, at_b, at_2b, capacity)
