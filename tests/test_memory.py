"""ampkit.memory: peak-memory readings."""

from __future__ import annotations

import torch

from ampkit.memory import peak_memory_bytes, reset_peak_memory


def test_cpu_peak_is_the_process_resident_set_and_never_drops():
    cpu = torch.device("cpu")
    reset_peak_memory(cpu)  # no-op on CPU
    before = peak_memory_bytes(cpu)
    assert set(before) == {"max_rss_bytes"}
    assert before["max_rss_bytes"] > 50 * 1024**2  # Python + torch are loaded
    block = torch.ones(64 * 1024**2 // 4)  # 64 MiB touched
    after = peak_memory_bytes(cpu)
    assert after["max_rss_bytes"] >= before["max_rss_bytes"]
    del block
    assert peak_memory_bytes(cpu)["max_rss_bytes"] >= after["max_rss_bytes"]  # a peak: freeing does not lower it
