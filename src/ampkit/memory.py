"""Peak-memory readings. Units: bytes; GiB = 1024**3 bytes (GB = 1000**3, never used here)."""

from __future__ import annotations

import resource
import sys

import torch

GIB = 1024**3


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> dict[str, int]:
    """CUDA: max allocated and reserved by the caching allocator. CPU: the process's peak resident
    set (it includes the Python interpreter and torch itself, ~300-400 MiB, and is never reset)."""
    if device.type == "cuda":
        return {
            "max_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "max_reserved_bytes": torch.cuda.max_memory_reserved(device),
        }
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # Linux reports KiB, macOS bytes
    return {"max_rss_bytes": rss * scale}
