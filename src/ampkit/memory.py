"""Peak-memory readings. Units: bytes; GiB = 1024**3 bytes (GB = 1000**3, never used here).

The device's own calls live in `ampkit.hardware.backend` (the accelerator's caching allocator through
`torch.accelerator`, or the CPU process's peak RSS); these are the names the loop and bench use.
"""

from __future__ import annotations

import torch

from ampkit.hardware.backend import backend_for

GIB = 1024**3


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak on an accelerator; a no-op on CPU (ru_maxrss is never reset)."""
    backend_for(device).reset_peak_memory()


def peak_memory_bytes(device: torch.device) -> dict[str, int]:
    """Accelerator: max allocated and reserved by the caching allocator. CPU: the process's peak resident
    set (it includes the Python interpreter and torch itself, ~300-400 MiB, and is never reset)."""
    return backend_for(device).peak_memory_bytes()
