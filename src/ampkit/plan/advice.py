"""Advice: which precision on which GPU, and the cheapest change that makes a run fit.

Precision: V100 and T4 have no bf16 tensor cores, so fp16-mixed with dynamic loss scaling is their
fast path; Ampere and newer run bf16-mixed (fp32's range, no scaler). Without a GPU, bf16-mixed.

Cheapest change, tried in this order (cost first, then fidelity, then hardware):
1. a smaller micro-batch with gradient accumulation (same tokens per step, same math; gradients
   then stay allocated across micro-batches, which the ledger counts);
2. activation checkpointing (recomputes the forward: about +33% compute);
3. 8-bit AdamW states (bitsandbytes; a small fidelity cost, no speed cost);
4. checkpointing + 8-bit states;
5. bf16-true (bf16 weights and updates; weigh its fidelity cost), alone then with 2 and 3;
6. sharding over more GPUs (FSDP), the smallest power-of-two count that fits, alone then with
   checkpointing.
Each is tried at the requested micro-batch, then with accumulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ampkit.hardware import GpuSpec
from ampkit.plan.analytic.ledger import analytic_ledger
from ampkit.plan.describe import ModelDescription
from ampkit.plan.fit import largest
from ampkit.plan.setting import GIB, StepSetting
from ampkit.precision import get_spec

MAX_FSDP_GPUS = 1024


@dataclass(frozen=True, kw_only=True)
class Fix:
    """A change to the planned step and what it buys."""

    change: str
    cost: str
    setting: StepSetting
    total_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "cost": self.cost,
            "setting": self.setting.to_dict(),
            "total_bytes": self.total_bytes,
            "total_gib": round(self.total_bytes / GIB, 3),
        }


def base_precision(gpu: GpuSpec | None) -> tuple[str, str]:
    """The default precision for a GPU, and why."""
    if gpu is None:
        return "bf16-mixed", "no GPU named: bf16-mixed is the default on Ampere and newer"
    if not gpu.native_bf16:
        return "fp16-mixed", (
            f"{gpu.name} has no bf16 tensor cores: fp16 with dynamic loss scaling is its fast "
            f"path ({gpu.peak_tflops.get('fp16', 0):g} vs {gpu.peak_tflops.get('fp32', 0):g} "
            "TFLOP/s fp32)"
        )
    return "bf16-mixed", (
        f"{gpu.name} runs bf16 natively ({gpu.peak_tflops.get('bf16', 0):g} TFLOP/s): fp32's range, no loss scaler"
    )


def _candidates(setting: StepSetting, gpu: GpuSpec | None) -> list[tuple[str, str, dict[str, Any]]]:
    ckpt = ("activation checkpointing", "+~33% compute (the forward is recomputed)", {"checkpointing": "full"})
    eight = ("8-bit AdamW states", "small fidelity cost, no speed cost (bitsandbytes)", {"optimizer": "adamw-8bit"})
    out = []
    if setting.checkpointing != "full":
        out.append(ckpt)
    if setting.optimizer == "adamw":
        out.append(eight)
        if setting.checkpointing != "full":
            out.append(
                (
                    "checkpointing + 8-bit AdamW",
                    f"{ckpt[1]}; {eight[1]}",
                    {"checkpointing": "full", "optimizer": "adamw-8bit"},
                )
            )
    bf16_ok = gpu is None or gpu.native_bf16
    if bf16_ok and not get_spec(setting.precision).low_precision_weights:
        true = ("bf16-true", "bf16 weights and updates: weigh the fidelity cost", {"precision": "bf16-true"})
        out.append(true)
        combo = {"precision": "bf16-true", "checkpointing": "full"}
        if setting.optimizer == "adamw":
            combo["optimizer"] = "adamw-8bit"
        out.append(
            (
                "bf16-true + checkpointing" + (" + 8-bit AdamW" if "optimizer" in combo else ""),
                f"{true[1]}; +~33% compute",
                combo,
            )
        )
    return out


def fix_settings(setting: StepSetting, gpu: GpuSpec | None) -> list[StepSetting]:
    """The steps `cheapest_fix` asks for at one process, in its order: `setting`, its candidates, and
    FSDP's with and without checkpointing (a step's table does not depend on the world size)."""
    out = [setting, *(replace(setting, **fields) for _, _, fields in _candidates(setting, gpu))]
    return [*out, replace(setting, checkpointing="full")]


def _try(
    desc: ModelDescription,
    setting: StepSetting,
    capacity: int,
    change: str,
    cost: str,
    kwargs: dict[str, Any],
    engine: Any = None,
) -> Fix | None:
    """The change at the requested micro-batch, else with the largest micro-batch + accumulation.
    `engine`: the ledger engine (`plan/engines.py`; the analytic one by default)."""
    ledger_of = engine.ledger if engine is not None else lambda s: analytic_ledger(desc, s, **kwargs)
    ledger = ledger_of(setting)
    if ledger.total <= capacity:
        return Fix(change=change, cost=cost, setting=setting, total_bytes=ledger.total)
    per_step = setting.micro_batch * setting.grad_accum
    if per_step < 2:
        return None
    accumulating = replace(setting, grad_accum=2)  # gradients held across micro-batches
    if engine is not None:
        m = engine.largest(accumulating, capacity, field="micro_batch")
    else:
        m = largest(desc, accumulating, capacity, field="micro_batch", **kwargs)
    m = min(m, per_step - 1)
    if m < 1:
        return None
    k = math.ceil(per_step / m)
    new = replace(setting, micro_batch=m, grad_accum=k)
    ledger = ledger_of(new)
    if ledger.total > capacity:
        return None
    prefix = "" if not change else f"{change}, "
    return Fix(
        change=f"{prefix}micro-batch {m} x {k} accumulation steps",
        cost=cost or "same math; smaller matmuls may lower throughput",
        setting=new,
        total_bytes=ledger.total,
    )


def cheapest_fix(
    desc: ModelDescription, setting: StepSetting, capacity: int, *, gpu: GpuSpec | None, engine: Any = None, **kwargs
) -> Fix | None:
    """The first change (in the module docstring's order) whose step fits; None if it already fits
    or nothing up to MAX_FSDP_GPUS does. `engine`: as in `_try`."""
    first = engine.ledger(setting) if engine is not None else analytic_ledger(desc, setting, **kwargs)
    if first.total <= capacity:
        return None
    fix = _try(desc, setting, capacity, "", "", kwargs, engine)
    if fix is not None:
        return fix
    for change, cost, fields in _candidates(setting, gpu):
        fix = _try(desc, replace(setting, **fields), capacity, change, cost, kwargs, engine)
        if fix is not None:
            return fix
    n = max(2, setting.world_size * 2)
    while n <= MAX_FSDP_GPUS:
        sharded = replace(setting, parallel="fsdp", world_size=n)
        cost = f"{n} GPUs; parameters, gradients and states sharded"
        for change, checkpointing, more in (
            (f"FSDP over {n} GPUs", sharded.checkpointing, ""),
            (f"FSDP over {n} GPUs + activation checkpointing", "full", "; +~33% compute"),
        ):
            fix = _try(
                desc, replace(sharded, checkpointing=checkpointing), capacity, change, cost + more, kwargs, engine
            )
            if fix is not None:
                return fix
        n *= 2
    return None


def fp8_note(gpu: GpuSpec | None) -> str | None:
    if gpu is None or gpu.peak_flops("fp8") is None:  # the card's fp8 tensor-core column (a dtype key)
        return None
    return (
        f"{gpu.name} has fp8 tensor cores ({gpu.peak_tflops['fp8']:g} vs {gpu.peak_tflops.get('bf16', 0):g} "
        "TFLOP/s bf16): the fp8 precision (torchao float8 Linears) can raise throughput; its memory is "
        "planned analytically, and traced through torchao's CPU emulation (native fp8 kernels need the GPU)"
    )
