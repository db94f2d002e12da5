"""The device's runtime calls, chosen once per device: synchronisation, step timing, peak and free
memory, the current device, and RNG state.

`backend_for(device)` returns `HostBackend` for the CPU and `AcceleratorBackend` for CUDA (and ROCm:
HIP answers torch's CUDA API), XPU and MPS. The accelerator calls go through `torch.accelerator` and
`torch.Event`, which serve every one of them; RNG states through the device's own module
(`torch.cuda`, `torch.xpu`, `torch.mps`). Callers hold the object and never ask which device it is:
outside `hardware/`, ampkit makes no `torch.cuda` call.

Hazards:
- Accelerator kernels run asynchronously: the host clock measures launches, not work. Step timing
  records an event pair on the stream per step and reads them after one synchronize at the end.
- Every `synchronize` is a CPU-device sync point: callers do it at window edges only.
- Free memory on CUDA (`get_memory_info` = cudaMemGetInfo) creates this process's context first, so
  the context is already counted as used.
- MPS shares the host's memory; torch builds older than the MPS allocator's `torch.accelerator`
  support (pytorch#186748) raise there, and `MpsBackend` falls back to `torch.mps`'s current readings.
Units: bytes; seconds (events report milliseconds, converted here).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ampkit.errors import UsageError
from ampkit.hardware.device import describe_device

RNG_DEVICE_TYPES = ("cuda", "xpu", "mps")
"""Device types whose generator states a checkpoint keeps, each under its own key (the "cuda" key is
the one checkpoints have always had, so older ones still resume)."""


class HostStepTimer:
    """CPU: ops run synchronously, so the host clock brackets the real work."""

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []

    def start(self) -> None:
        self._starts.append(time.perf_counter())

    def stop(self) -> None:
        self._ends.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Per-step seconds, in order."""
        return [end - start for start, end in zip(self._starts, self._ends)]


class EventStepTimer:
    """An accelerator: one pair of timing events per step, read after a single synchronize at the end."""

    def __init__(self, device: torch.device, *, synchronize: Callable[[], None], event: Callable[..., Any]):
        self.device, self._synchronize, self._event = device, synchronize, event
        self._events: list[tuple[Any, Any]] = []

    def _new(self) -> Any:
        return self._event(self.device, enable_timing=True)

    def start(self) -> None:
        start = self._new()
        start.record()
        self._events.append((start, self._new()))

    def stop(self) -> None:
        self._events[-1][1].record()

    def seconds(self) -> list[float]:
        self._synchronize()  # sync point: once, after the measured loop
        return [start.elapsed_time(end) / 1000.0 for start, end in self._events]  # elapsed_time is ms


def host_peak_rss_bytes() -> int:
    """The process's peak resident set in bytes (Linux reports KiB, macOS bytes); never reset."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss * (1 if sys.platform == "darwin" else 1024)


class HostBackend:
    """The CPU: nothing to wait for; memory is the process's peak resident set."""

    type = "cpu"
    asynchronous = False
    """Work is done when the call returns: logging every step costs nothing extra."""

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def step_timer(self) -> HostStepTimer:
        return HostStepTimer()

    def reset_peak_memory(self) -> None:
        """ru_maxrss cannot be reset: the CPU reading is the process's peak since it started."""

    def empty_cache(self) -> None:
        """No caching allocator on the host: nothing to give back."""

    def peak_memory_bytes(self) -> dict[str, int]:
        """The process's peak RSS (it includes the interpreter and torch itself, ~300-400 MiB)."""
        return {"max_rss_bytes": host_peak_rss_bytes()}


class AcceleratorBackend:
    """CUDA, ROCm, XPU or MPS through `torch.accelerator` (`api`) and `torch.Event` (`event`).

    `api` and `event` are parameters so that the call order can be checked on a CPU with stand-ins;
    ampkit itself always passes torch's own."""

    asynchronous = True
    """Kernels run after the call returns: reading a clock needs a sync point."""

    def __init__(self, device: torch.device, *, api: Any = torch.accelerator, event: Callable[..., Any] = torch.Event):
        self.device, self.api, self._event = device, api, event
        self.type = device.type

    def synchronize(self) -> None:
        self.api.synchronize(self.device)  # note: a CPU-device sync point; the clock must wait for the kernels

    def step_timer(self) -> EventStepTimer:
        return EventStepTimer(self.device, synchronize=self.synchronize, event=self._event)

    def reset_peak_memory(self) -> None:
        self.api.reset_peak_memory_stats(self.device)

    def empty_cache(self) -> None:
        """The caching allocator's unused blocks go back to the device (other processes can use them)."""
        self.api.empty_cache()

    def peak_memory_bytes(self) -> dict[str, int]:
        """The caching allocator's maxima since the last reset: tensors (allocated) and the pool (reserved)."""
        return {
            "max_allocated_bytes": int(self.api.max_memory_allocated(self.device)),
            "max_reserved_bytes": int(self.api.max_memory_reserved(self.device)),
        }

    def free_memory_bytes(self) -> int:
        """What the device can still give (all processes counted); on CUDA this creates the context first."""
        free, _total = self.api.get_memory_info(self.device)
        return int(free)

    def device_count(self) -> int:
        return int(self.api.device_count())

    def make_current(self) -> None:
        """Make this device the current one (kernels, caching allocator, collectives default to it)."""
        self.api.set_device_index(self.device)


class MpsBackend(AcceleratorBackend):
    """Apple's GPU. Memory readings fall back to `torch.mps` where torch's build predates the MPS
    allocator's `torch.accelerator` support; those are current readings, a lower bound of the peak."""

    def __init__(self, device: torch.device, *, module: Any = None, **kwargs: Any) -> None:
        super().__init__(device, **kwargs)
        self.module = module if module is not None else torch.mps

    def reset_peak_memory(self) -> None:
        try:
            super().reset_peak_memory()
        except RuntimeError:  # this torch's MPS allocator has no peak statistics
            pass

    def peak_memory_bytes(self) -> dict[str, int]:
        try:
            return super().peak_memory_bytes()
        except RuntimeError:  # current tensors and the Metal driver's pool: no peak to read
            return {
                "max_allocated_bytes": int(self.module.current_allocated_memory()),
                "max_reserved_bytes": int(self.module.driver_allocated_memory()),
            }

    def free_memory_bytes(self) -> int:
        try:
            return super().free_memory_bytes()
        except RuntimeError:  # Metal's recommended working set less what the driver already holds
            return max(0, int(self.module.recommended_max_memory()) - int(self.module.driver_allocated_memory()))


def backend_for(device: torch.device | str) -> HostBackend | AcceleratorBackend:
    """The runtime calls of `device`, chosen once: call at build time and keep the object."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return HostBackend()
    if dev.type == "mps":
        return MpsBackend(dev)
    if dev.type in RNG_DEVICE_TYPES:
        return AcceleratorBackend(dev)
    raise UsageError(f"device type {dev.type!r} is not supported; use cpu, cuda, xpu or mps")


def with_index(device: torch.device) -> torch.device:
    """`device` with its index: an accelerator without one gets the current device's."""
    if device.type == "cpu" or device.index is not None:
        return device
    return torch.device(device.type, torch.accelerator.current_device_index())


# ---------------------------------------------------------------- RNG state


def device_rng_states(device_type: str, module: Any) -> list[torch.Tensor]:
    """Every `device_type` generator's state (one per device) from its module (`torch.cuda`, ...)."""
    if device_type == "mps":  # one device, one generator
        return [module.get_rng_state()]
    return list(module.get_rng_state_all())


def set_device_rng_states(device_type: str, module: Any, states: list[torch.Tensor]) -> None:
    if device_type == "mps":
        module.set_rng_state(states[0])
    else:
        module.set_rng_state_all(states)


def _available_rng_types() -> list[str]:
    """The accelerator type of this build, when it is usable here (at most one: torch builds for one)."""
    found = torch.accelerator.current_accelerator()
    if found is None or found.type not in RNG_DEVICE_TYPES:
        return []
    return [found.type] if torch.get_device_module(found.type).is_available() else []


def capture_accelerator_rng() -> dict[str, list[torch.Tensor]]:
    """{device type: its generators' states} for the accelerator here, whatever device the run uses
    (a CPU run on a GPU machine still draws nothing there, but a resume must not care)."""
    return {kind: device_rng_states(kind, torch.get_device_module(kind)) for kind in _available_rng_types()}


def restore_accelerator_rng(state: Mapping[str, Any]) -> None:
    """Put back the states `capture_accelerator_rng` saved, for the accelerator here; keys of other
    device types (a CUDA checkpoint resumed on a Mac) are left alone."""
    for kind in _available_rng_types():
        if kind in state:
            set_device_rng_states(kind, torch.get_device_module(kind), list(state[kind]))


def free_device_memory(device: torch.device) -> tuple[int, str]:
    """(free bytes, a label naming the device) for accelerator `device`; a CPU-device sync point."""
    backend = backend_for(device)
    if not isinstance(backend, AcceleratorBackend):
        raise ValueError(f"{device} is not an accelerator: the host's memory is read elsewhere")
    return backend.free_memory_bytes(), f"free on {device} ({describe_device(device).name})"
