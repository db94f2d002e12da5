"""ampkit.hardware.backend: the device's runtime calls, chosen once.

The CPU backend runs for real. The accelerator backends get stand-ins for `torch.accelerator`, for
`torch.Event` and for the device module (this machine has no CUDA, XPU or MPS device), and the tests
check what ampkit does with them: which device each call names, one synchronize before the events are
read, milliseconds turned into seconds, the MPS fallbacks, RNG states kept per device type.
"""

from __future__ import annotations

import time

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.hardware.backend import (
    AcceleratorBackend,
    EventStepTimer,
    HostBackend,
    MpsBackend,
    backend_for,
    capture_accelerator_rng,
    device_rng_states,
    free_device_memory,
    restore_accelerator_rng,
    set_device_rng_states,
    with_index,
)


class RecordingAccelerator:
    """Stands in for `torch.accelerator`: records (call, device) and answers with fixed figures."""

    def __init__(self):
        self.calls: list[tuple[str, object]] = []

    def _record(self, name, device):
        self.calls.append((name, device))

    def synchronize(self, device):
        self._record("synchronize", device)

    def reset_peak_memory_stats(self, device):
        self._record("reset_peak_memory_stats", device)

    def max_memory_allocated(self, device):
        self._record("max_memory_allocated", device)
        return 3 * 1024**3

    def max_memory_reserved(self, device):
        self._record("max_memory_reserved", device)
        return 4 * 1024**3

    def get_memory_info(self, device):
        self._record("get_memory_info", device)
        return (10 * 1024**3, 64 * 1024**3)

    def device_count(self):
        return 2

    def set_device_index(self, device):
        self._record("set_device_index", device)


class UnsupportedAccelerator(RecordingAccelerator):
    """A torch whose MPS allocator has no `torch.accelerator` memory statistics."""

    def _record(self, name, device):
        if name != "synchronize":
            raise RuntimeError("MPS doesn't support torch.accelerator memory API")
        super()._record(name, device)


class ClockEvent:
    """Stands in for `torch.Event`: `record()` reads a fake clock; `elapsed_time` is in milliseconds."""

    clock_ms = 0.0

    def __init__(self, device, *, enable_timing):
        assert enable_timing
        self.device, self.at_ms = device, None

    def record(self):
        self.at_ms = ClockEvent.clock_ms

    def elapsed_time(self, end):
        return end.at_ms - self.at_ms


def test_host_backend_times_with_the_host_clock_and_reads_peak_rss():
    backend = backend_for("cpu")
    assert isinstance(backend, HostBackend) and not backend.asynchronous
    backend.synchronize()  # nothing to wait for
    timer = backend.step_timer()
    for seconds in (0.01, 0.03):
        timer.start()
        time.sleep(seconds)
        timer.stop()
    first, second = timer.seconds()
    assert 0.009 < first < second and second >= 0.029
    backend.reset_peak_memory()  # no-op: ru_maxrss is never reset
    assert set(backend.peak_memory_bytes()) == {"max_rss_bytes"}


@pytest.mark.parametrize("device", ["cuda", "xpu:1", "mps"])
def test_backend_for_each_accelerator(device):
    backend = backend_for(device)
    assert isinstance(backend, AcceleratorBackend) and backend.asynchronous
    assert backend.type == torch.device(device).type
    assert isinstance(backend, MpsBackend) == (backend.type == "mps")


def test_backend_for_refuses_a_device_type_ampkit_does_not_run():
    with pytest.raises(UsageError, match="cpu, cuda, xpu or mps"):
        backend_for("meta")


def test_event_timer_reads_events_after_one_synchronize_in_seconds():
    syncs = []
    timer = EventStepTimer(torch.device("xpu", 0), synchronize=lambda: syncs.append(1), event=ClockEvent)
    for step_ms in (20.0, 50.0):
        timer.start()
        ClockEvent.clock_ms += step_ms
        timer.stop()
        ClockEvent.clock_ms += 1.0  # host work between steps is not counted
    assert syncs == []  # no sync point inside the measured loop
    assert timer.seconds() == pytest.approx([0.020, 0.050])
    assert syncs == [1]


def test_accelerator_backend_names_its_device_in_every_call():
    api = RecordingAccelerator()
    device = torch.device("xpu", 1)
    backend = AcceleratorBackend(device, api=api, event=ClockEvent)
    backend.reset_peak_memory()
    assert backend.peak_memory_bytes() == {"max_allocated_bytes": 3 * 1024**3, "max_reserved_bytes": 4 * 1024**3}
    assert backend.free_memory_bytes() == 10 * 1024**3
    backend.make_current()
    timer = backend.step_timer()
    timer.start()
    timer.stop()
    timer.seconds()
    names = [name for name, _ in api.calls]
    assert names == [
        "reset_peak_memory_stats",
        "max_memory_allocated",
        "max_memory_reserved",
        "get_memory_info",
        "set_device_index",
        "synchronize",
    ]
    assert all(seen == device for _, seen in api.calls)
    assert backend.device_count() == 2


class FakeMpsModule:
    """Stands in for `torch.mps` (current readings, no peaks; one generator)."""

    def __init__(self):
        self.state = torch.arange(4, dtype=torch.uint8)

    def current_allocated_memory(self):
        return 1024**3

    def driver_allocated_memory(self):
        return 5 * 1024**3

    def recommended_max_memory(self):
        return 16 * 1024**3

    def get_rng_state(self):
        return self.state.clone()

    def set_rng_state(self, state):
        self.state = state.clone()


def test_mps_backend_falls_back_to_torch_mps_readings():
    backend = MpsBackend(torch.device("mps"), module=FakeMpsModule(), api=UnsupportedAccelerator(), event=ClockEvent)
    backend.reset_peak_memory()  # not supported: no error
    assert backend.peak_memory_bytes() == {"max_allocated_bytes": 1024**3, "max_reserved_bytes": 5 * 1024**3}
    assert backend.free_memory_bytes() == 11 * 1024**3  # recommended working set less the driver's pool
    supported = MpsBackend(torch.device("mps"), module=FakeMpsModule(), api=RecordingAccelerator(), event=ClockEvent)
    assert supported.peak_memory_bytes()["max_allocated_bytes"] == 3 * 1024**3  # torch.accelerator when it answers


def test_free_device_memory_is_for_accelerators_only():
    with pytest.raises(ValueError, match="not an accelerator"):
        free_device_memory(torch.device("cpu"))


def test_with_index_leaves_the_cpu_and_indexed_devices_alone():
    assert with_index(torch.device("cpu")) == torch.device("cpu")
    assert with_index(torch.device("xpu", 3)) == torch.device("xpu", 3)


# ---------------------------------------------------------------- RNG state


class FakeMultiDeviceModule:
    """Stands in for `torch.cuda` / `torch.xpu`: one generator per device."""

    def __init__(self, devices: int):
        self.states = [torch.full((8,), i, dtype=torch.uint8) for i in range(devices)]

    def is_available(self):
        return True

    def get_rng_state_all(self):
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states):
        self.states = [s.clone() for s in states]


def test_rng_states_round_trip_per_device_type():
    xpu = FakeMultiDeviceModule(devices=2)
    saved = device_rng_states("xpu", xpu)
    xpu.states = [torch.zeros(8, dtype=torch.uint8)] * 2
    set_device_rng_states("xpu", xpu, saved)
    assert [int(s[0]) for s in xpu.states] == [0, 1]
    mps = FakeMpsModule()
    saved = device_rng_states("mps", mps)
    assert len(saved) == 1  # one device, one generator
    mps.state = torch.zeros(4, dtype=torch.uint8)
    set_device_rng_states("mps", mps, saved)
    assert mps.state.tolist() == [0, 1, 2, 3]


def test_no_accelerator_here_keeps_only_cpu_generators():
    assert capture_accelerator_rng() == {}  # this CPU build of torch has no accelerator
    restore_accelerator_rng({"cuda": [torch.zeros(8, dtype=torch.uint8)]})  # a CUDA checkpoint resumed here: ignored


def test_the_accelerator_present_is_saved_and_restored_under_its_type(monkeypatch):
    xpu = FakeMultiDeviceModule(devices=2)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("xpu"))
    monkeypatch.setattr(torch, "get_device_module", lambda device_type: {"xpu": xpu}[device_type])
    state = capture_accelerator_rng()
    assert list(state) == ["xpu"] and len(state["xpu"]) == 2
    xpu.states = [torch.zeros(8, dtype=torch.uint8)] * 2
    restore_accelerator_rng({"cuda": [torch.ones(8, dtype=torch.uint8)], **state})  # the cuda key is not this device's
    assert [int(s[0]) for s in xpu.states] == [0, 1]
