"""The distributed settings of `ampkit train` and their checks (no torch import: config-time only).

Process counts follow torchrun: `--nproc-per-node` (train's `--nproc` is its alias) and `--nnodes`.
`ampkit.sections.ParallelSection` holds them; the checks take the values, so they run on any section."""

from __future__ import annotations

from ampkit.errors import UsageError
from ampkit.options import PARALLEL_MODES

REDUCE_DTYPES = ("fp32", "bf16")


def check_parallel_settings(
    *, parallel: str, reduce_dtype: str, nproc_per_node: int, nnodes: int, dist_timeout_s: float = 600.0
) -> None:
    """Refuse a parallel mode, reduce dtype or process count that cannot run, with the fix in the message."""
    if parallel not in PARALLEL_MODES:
        raise UsageError(f"unknown --parallel {parallel!r}; choose one of: {', '.join(PARALLEL_MODES)}")
    if reduce_dtype not in REDUCE_DTYPES:
        raise UsageError(f"unknown --reduce-dtype {reduce_dtype!r}; choose one of: {', '.join(REDUCE_DTYPES)}")
    if nproc_per_node < 0:
        raise UsageError(f"--nproc-per-node must be >= 0 (0 = no re-launch), got {nproc_per_node}")
    if nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {nnodes}")
    if not dist_timeout_s > 0:
        raise UsageError(f"--dist-timeout-s must be > 0 seconds, got {dist_timeout_s}")
    if nproc_per_node > 0 and parallel == "none":
        raise UsageError(
            f"--nproc-per-node {nproc_per_node} starts {nproc_per_node} processes: "
            "add --parallel ddp or --parallel fsdp"
        )


def check_single_process(parallel: str, parts: list[str]) -> None:
    """Refuse what `--parallel` cannot run: `parts` names what the run turns on that this mode cannot
    (`ampkit.sections.GuardSection.single_process_parts`: "--grad-stats-every" under fsdp)."""
    if parallel != "none" and parts:
        raise UsageError(
            f"{parts[0]} reads whole gradients and weights, which --parallel {parallel} shards: "
            "use --parallel ddp, or diagnose with 'ampkit doctor' / a --parallel none run"
        )


def check_inject_rank(inject_rank: int, *, inject: str, world_size: int | None) -> None:
    """Refuse an `--inject-rank` without a fault, or past the job's ranks (`world_size`: None while
    unknown, e.g. a process torchrun starts checks again once it has joined the job)."""
    if inject_rank < 0:
        return
    if not inject:
        raise UsageError(f"--inject-rank {inject_rank} names where a fault fires: add --inject module:phase:kind")
    if world_size is not None and inject_rank >= world_size:
        raise UsageError(
            f"--inject-rank {inject_rank} is past the job's {world_size} rank(s) (0..{world_size - 1}): "
            "pick a rank below the world size, or -1 for every rank"
        )


def known_world_size(*, parallel: str, nproc_per_node: int, nnodes: int) -> int | None:
    """The job's ranks as the settings say: 1 without `--parallel`, nproc x nnodes when this command
    starts them, None when torchrun does (its environment says, once the process has joined)."""
    if parallel == "none":
        return 1
    return nproc_per_node * nnodes if nproc_per_node > 0 else None
