"""Measure a real training step's peak memory on CPU, to check the traced engine against reality.

Method: the same step as `trace.trace_step` (the ampkit model, the precision policy, clipping, the
optimizer, optimizer states created by a warm-up step) runs on real CPU tensors under
`torch.profiler.profile(profile_memory=True)`. PyTorch's CPU allocator reports every allocation and
free to the profiler; their running sum, in time order, peaks at the step's peak above what was
already held when profiling began. What was held (parameters, optimizer states, the batch) is
known exactly from those tensors' storages. Peak = held + highest running sum.
This is independent of `StorageTracker`: it reads allocator events, not Python objects.
CPU only: on an accelerator use `torch.accelerator.max_memory_allocated` (`ampkit.memory`).
"""

from __future__ import annotations

import torch

from ampkit.data import Batch
from ampkit.errors import UsageError
from ampkit.models import build_model
from ampkit.plan.describe import ModelDescription
from ampkit.plan.optim import build_optimizer
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced.trace import _train_step, _warm_up, random_batch
from ampkit.plan.traced.tracker import StorageTracker
from ampkit.precision import Precision, build_precision


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch) -> int:
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return _storage_bytes(tensors + list(batch))


def _allocator_peak(prof) -> int:
    """Highest running sum of the allocator's reported allocations (+) and frees (-)."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for event in events:
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def profiled_step_peak(
    model: torch.nn.Module, policy: Precision, optimizer: torch.optim.Optimizer, batch: Batch
) -> int:
    """Bytes the allocator reports at the peak of one real step of `batch`, above what was held before it."""
    from torch.profiler import ProfilerActivity, profile

    with policy.run_context(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _train_step(model, policy, optimizer, StorageTracker(), batch)  # an unentered tracker only names phases
    return _allocator_peak(prof)


def measure_cpu_step_peak(desc: ModelDescription, setting: StepSetting, *, seed: int = 0) -> int:
    """Bytes at the peak of one real steady-state training step on CPU (see the module docstring)."""
    cfg = desc.model_config
    if cfg is None:  # not `desc.buildable`
        raise UsageError(f"cannot measure {desc.name}: ampkit cannot build a {desc.family} model")
    if setting.checkpointing != "none":
        raise UsageError("the CPU measurement runs without activation checkpointing")
    policy = build_precision(setting.precision, device_type="cpu")
    model = policy.convert_module(build_model(cfg, seed=seed))
    optimizer = build_optimizer(setting.optimizer, model)
    _warm_up(model, optimizer, keep_grads=setting.grad_accum > 1)
    batch = random_batch(desc.vocab_size, setting, generator=torch.Generator().manual_seed(seed))
    held = _held_bytes(model, optimizer, [batch.input_ids, batch.targets])
    return held + profiled_step_peak(model, policy, optimizer, batch)
