"""The distributed settings of `ampkit train` and their checks (no torch import: config-time only).

Process counts follow torchrun: `--nproc-per-node` (train's `--nproc` is its alias) and `--nnodes`.
`ampkit.sections.ParallelSection` holds them; the checks take the values, so they run on any section."""

from __future__ import annotations

from ampkit.errors import UsageError
from ampkit.options import PARALLEL_MODES

REDUCE_DTYPES = ("fp32", "bf16")


def check_parallel_settings(*, parallel: str, reduce_dtype: str, nproc_per_node: int, nnodes: int) -> None:
    """Refuse a parallel mode, reduce dtype or process count that cannot run, with the fix in the message."""
    if parallel not in PARALLEL_MODES:
        raise UsageError(f"unknown --parallel {parallel!r}; choose one of: {', '.join(PARALLEL_MODES)}")
    if reduce_dtype not in REDUCE_DTYPES:
        raise UsageError(f"unknown --reduce-dtype {reduce_dtype!r}; choose one of: {', '.join(REDUCE_DTYPES)}")
    if nproc_per_node < 0:
        raise UsageError(f"--nproc-per-node must be >= 0 (0 = no re-launch), got {nproc_per_node}")
    if nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {nnodes}")
    if nproc_per_node > 0 and parallel == "none":
        raise UsageError(
            f"--nproc-per-node {nproc_per_node} starts {nproc_per_node} processes: "
            "add --parallel ddp or --parallel fsdp"
        )


def check_single_process(parallel: str, parts: list[str]) -> None:
    """Refuse, under `--parallel ddp|fsdp`, what runs in a single process only: `parts` names what the run
    turns on (`ampkit.sections.GuardSection.single_process_parts`: "--inject", ...)."""
    if parallel != "none" and parts:
        raise UsageError(
            f"{parts[0]} runs in a single process only; drop it with --parallel {parallel}, "
            "or diagnose with 'ampkit doctor' / a --parallel none run"
        )
