"""Why a precision is faster, or not: one training step under torch.profiler, its time by category,
and its memory peak as the allocator saw it.

Categories (`CATEGORIES`), each op's *self* time filed under the first rule that matches:
0. `communication`: a collective or inside one (`bench --parallel`): c10d's ops (all_reduce,
   reduce_scatter, all_gather, broadcast), gloo's and nccl's own ranges and nccl's kernels (device time),
   FSDP2's all-gather and post-backward reduce scopes (their waits, copy-in/out and casts included);
   wherever it runs, the optimizer's gradient-norm all-reduce too. Zero in one process. Hazard: the
   profiler records no op for DDP's wait on its overlapped bucket all-reduces at the end of backward
   (the autograd engine's final callback): on gloo that wait lands in `other`, the row holds the
   all-reduces' launches (on CUDA, nccl's kernels are timed on the device);
1. `data`: inside the step's batch fetch and its move to the device (a scope around the sampler);
2. `optimizer`: the step's optimizer phase (unscale, clipping, the optimizer step, zero_grad; a scope
   opened by the trainer's phase hook) or torch's own `Optimizer.step` ranges;
3. `casts` and `matmul`: the nearest enclosing op that is a dtype cast (`aten::to`, `_to_copy`,
   autocast's casts) or a matmul/attention op (mm, addmm, bmm, linear, convolutions, SDPA kernels),
   forward and backward (autograd's backward ops are aten ops too);
4. `norm`: inside a normalisation module (class name containing "Norm": RMSNorm, LayerNorm,
   BatchNorm, ...), or the backward of an op recorded there (matched by autograd sequence number),
   or a native norm kernel (layer_norm, rms_norm, batch_norm, group_norm);
5. `elementwise`: any other computing aten op (pointwise ops and reductions: add, mul, GELU, softmax,
   the loss);
6. `other`: the rest of the step's wall time: layout and copies (views, cat, index, embedding
   lookups), allocation, the autograd engine and Python between ops.
Shares are of the profiled step's wall time (CPU: host self time; CUDA: each op's kernel time, the
rest of the wall time -- launch gaps -- under `other`), so they sum to 100%.
Memory: on CPU the running sum of the allocator's reported allocations and frees during the step
plus what was held when it began (parameters, gradients, optimizer states), as
`ampkit.plan.traced.measure` does; on CUDA `max_memory_allocated` over the step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from ampkit.bench.gemm_probe import step_gemms
from ampkit.hardware.backend import backend_for
from ampkit.plan.traced.measure import _allocator_peak, _storage_bytes

if TYPE_CHECKING:
    from torch.autograd.profiler_util import FunctionEvent

    from ampkit.core.step import BatchSource, StepResult, Trainer

CATEGORIES = {
    "matmul": "matmul/attention",
    "norm": "normalisation",
    "elementwise": "elementwise",
    "casts": "dtype casts",
    "optimizer": "optimizer",
    "data": "data",
    "communication": "communication",
    "other": "other",
}
DATA_SCOPE, OPTIMIZER_SCOPE, NORM_SCOPE = "ampkit::data", "ampkit::optimizer", "ampkit::norm"
_BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
_CASTS = {"to", "_to_copy", "_autocast_to_reduced_precision", "_autocast_to_full_precision", "type_as"}
_MATMULS = {"matmul", "linear", "einsum", "mv", "addmv", "dot", "vdot", "_mkl_linear", "mkldnn_linear"}
_NORMS = ("layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm")
_COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "ncclDevKernel", "ncclKernel", "record_param_comms")
_FSDP_PREFIXES = ("FSDP::", "fsdp::")  # FSDP2's scopes: "FSDP::all_gather (0)", "FSDP::post_backward_reduce (0)"
_COMM_WORDS = ("all_gather", "allgather", "reduce", "broadcast")
_LAYOUT = frozenset(
    [
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "as_strided",
        "transpose",
        "t",
        "permute",
        "expand",
        "expand_as",
        "slice",
        "select",
        "squeeze",
        "unsqueeze",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "detach",
        "detach_",
        "alias",
        "contiguous",
        "clone",
        "copy_",
        "lift_fresh",
        "split",
        "split_with_sizes",
        "chunk",
        "narrow",
        "unbind",
        "flatten",
        "unflatten",
        "view_as",
        "set_",
        "item",
        "_local_scalar_dense",
        "is_nonzero",
        "index",
        "index_select",
        "gather",
        "scatter",
        "scatter_add_",
        "index_put_",
        "_index_put_impl_",
        "embedding",
        "embedding_dense_backward",
        "masked_select",
        "nonzero",
        "cat",
        "stack",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "arange",
        "randperm",
        "select_backward",
        "slice_backward",
    ]
)


def _aten(name: str) -> str | None:
    return name[6:] if name.startswith("aten::") else None


def _direct_kind(name: str) -> str | None:
    """ "casts" or "matmul" for an op that is one, else None."""
    base = _aten(name)
    if base is None:
        return None
    if base in _CASTS:
        return "casts"
    if base in _MATMULS or base.endswith("mm") or "convolution" in base or base.startswith("conv"):
        return "matmul"
    if "scaled_dot_product" in base or "attention" in base:
        return "matmul"
    return None


def _is_norm_op(name: str) -> bool:
    base = _aten(name)
    return base is not None and any(n in base for n in _NORMS)


def _is_compute(name: str) -> bool:
    base = _aten(name)
    return base is not None and base not in _LAYOUT


def is_collective(name: str) -> bool:
    """A collective's op, range or kernel (c10d, gloo, nccl), or FSDP2's scope around one."""
    if name.startswith(_COMM_PREFIXES):
        return True
    return name.startswith(_FSDP_PREFIXES) and any(word in name for word in _COMM_WORDS)


def _chain(event: FunctionEvent | None) -> list[FunctionEvent]:
    out = []
    while event is not None:
        out.append(event)
        event = event.cpu_parent
    return out


def _norm_sequence_numbers(events: Iterable[FunctionEvent]) -> set[int]:
    """Autograd sequence numbers of the ops recorded inside a normalisation module's forward."""
    found = set()
    for event in events:
        if event.sequence_nr >= 0 and _aten(event.name) and any(e.name == NORM_SCOPE for e in _chain(event)):
            found.add(event.sequence_nr)
    return found


def category_of(chain: list, norm_seq: set[int]) -> str:
    """The category of the first event of `chain` (the event, then its ancestors), by the rules above."""
    names = [e.name for e in chain]
    if any(is_collective(n) for n in names):
        return "communication"
    if DATA_SCOPE in names:
        return "data"
    if OPTIMIZER_SCOPE in names or any(n.startswith(("Optimizer.step#", "Optimizer.zero_grad#")) for n in names):
        return "optimizer"
    for name in names:
        kind = _direct_kind(name)
        if kind is not None:
            return kind
    if NORM_SCOPE in names or any(_is_norm_op(n) for n in names):
        return "norm"
    if any(e.name.startswith(_BACKWARD_PREFIX) and e.sequence_nr in norm_seq for e in chain):
        return "norm"
    if any(_is_compute(n) for n in names):
        return "elementwise"
    return "other"


def categorize(events: Iterable[FunctionEvent], *, device_time: bool = False) -> dict[str, float]:
    """Self time per category in microseconds (`other` holds only the ops filed there)."""
    norm_seq = _norm_sequence_numbers(events)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for event in events:
        spent = event.self_device_time_total if device_time else event.self_cpu_time_total
        if spent > 0:
            totals[category_of(_chain(event), norm_seq)] += spent
    return totals


def breakdown(times_us: dict[str, float], wall_s: float) -> dict[str, Any]:
    """Shares of the step's wall time; `other` takes the time no op accounts for (never negative)."""
    named = {key: times_us.get(key, 0.0) for key in CATEGORIES if key != "other"}
    total_us = max(wall_s * 1e6, sum(times_us.values()))
    ms = {key: value / 1e3 for key, value in named.items()}
    ms["other"] = (total_us - sum(named.values())) / 1e3
    return {
        "step_ms": total_us / 1e3,
        "ms": ms,
        "shares": {key: value * 1e3 / total_us for key, value in ms.items()},
    }


class _Scoped:
    """A batch whose move to the device runs inside the data scope."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def to(self, device: torch.device | str, **kwargs: Any) -> Any:
        with record_function(DATA_SCOPE):
            return self.batch.to(device, **kwargs)


class _ScopedSampler:
    def __init__(self, sampler: BatchSource) -> None:
        self.sampler = sampler

    def next_batch(self) -> _Scoped:
        with record_function(DATA_SCOPE):
            return _Scoped(self.sampler.next_batch())


class _PhaseScopes:
    """The trainer's phase hook: the optimizer phase runs in a scope (closed after the step)."""

    def __init__(self) -> None:
        self.open: Any = None

    def enter(self, phase: str) -> None:
        self.close()
        if phase == "optimizer":
            self.open = record_function(OPTIMIZER_SCOPE)
            self.open.__enter__()

    def close(self) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None


def _norm_hooks(model: nn.Module) -> list:
    """Forward hooks that run every normalisation module's forward inside the norm scope."""
    stack: list = []

    def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
        scope = record_function(NORM_SCOPE)
        scope.__enter__()
        stack.append(scope)

    def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if stack:
            stack.pop().__exit__(None, None, None)

    handles = []
    for module in model.modules():
        if "Norm" in type(module).__name__:
            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


@contextlib.contextmanager
def scoped_step(trainer: Trainer) -> Iterator[None]:
    """The trainer with its sampler, phases and normalisation modules scoped for the profiler."""
    sampler, phases = trainer.sampler, trainer.phases
    scopes = _PhaseScopes()
    handles = _norm_hooks(trainer.model)
    trainer.sampler, trainer.phases = _ScopedSampler(sampler), scopes
    try:
        yield
    finally:
        scopes.close()
        trainer.sampler, trainer.phases = sampler, phases
        for handle in handles:
            handle.remove()


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes the step starts with: parameters, gradients, optimizer states. FSDP2's are DTensors: their
    local shards count (a DTensor wrapper has no storage of its own)."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return _storage_bytes([_local(t) for t in tensors])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor's shard on this rank
    return to_local() if to_local is not None else tensor


_DEVICE_ACTIVITY = {"cuda": ProfilerActivity.CUDA, "xpu": ProfilerActivity.XPU}
"""The profiler's device-side activity per torch device type (ROCm is "cuda"); MPS: host-side events only."""


def profile_step(
    trainer: Trainer, *, device: torch.device, record_shapes: bool = False
) -> tuple[StepResult, dict[str, Any], int]:
    """One training step under torch.profiler: (StepResult, breakdown, step peak bytes). With
    `record_shapes` (fp32's worker: a few microseconds more per op) the breakdown's "gemms" are the
    step's distinct GEMMs (`bench.gemm_probe.Gemm.to_list`), for the budget's probe."""
    backend = backend_for(device)
    accelerator = device.type != "cpu"
    activity = _DEVICE_ACTIVITY.get(device.type)
    activities = [ProfilerActivity.CPU] + ([activity] if activity is not None else [])
    held = 0 if accelerator else held_bytes(trainer.model, trainer.optimizer)
    if accelerator:
        backend.synchronize()
        backend.reset_peak_memory()
    with (
        profile(activities=activities, profile_memory=not accelerator, record_shapes=record_shapes) as prof,
        scoped_step(trainer),
    ):
        start = time.perf_counter()
        result = trainer.train_step()
        backend.synchronize()  # sync point on an accelerator: the profiled step's end (untimed by the bench)
        wall_s = time.perf_counter() - start
    peak = backend.peak_memory_bytes()["max_allocated_bytes"] if accelerator else held + _allocator_peak(prof)
    device_time = activity is not None
    report = breakdown(categorize(prof.events(), device_time=device_time), wall_s)
    report["top_ops"] = _top_ops(prof, device_time)
    if record_shapes:
        report["gemms"] = [g.to_list() for g in step_gemms(prof.events(), device_time=device_time)]
    return result, report, peak


def _top_ops(prof: profile, device_time: bool, count: int = 6) -> list[list]:
    """The ops with the most self time: [name, ms]."""
    rows = [
        (e.key, (e.self_device_time_total if device_time else e.self_cpu_time_total) / 1e3) for e in prof.key_averages()
    ]
    rows.sort(key=lambda row: -row[1])
    return [[name, round(ms, 3)] for name, ms in rows[:count]]
