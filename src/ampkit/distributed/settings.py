"""The distributed settings of `ampkit train` and their checks (no torch import: config-time only).

Process counts follow torchrun: `--nproc-per-node` (train's `--nproc` is its alias) and `--nnodes`."""

from __future__ import annotations

from ampkit.errors import UsageError
from ampkit.options import PARALLEL_MODES

REDUCE_DTYPES = ("fp32", "bf16")

# Single-process diagnostics that hook every module or roll the run back from a checkpoint file;
# none of them knows about sharded parameters or peer ranks yet.
_SINGLE_PROCESS_ONLY = {
    "guard": "the NaN guard's rollback",
    "detect_nonfinite": "--detect-nonfinite",
    "grad_stats_every": "--grad-stats-every",
    "inject": "--inject",
}


def check_parallel_settings(config) -> None:
    """Refuse settings that cannot run data-parallel, with the fix in the message.

    `config` is a `TrainConfig` (duck-typed to keep this module free of imports)."""
    if config.parallel not in PARALLEL_MODES:
        raise UsageError(f"unknown --parallel {config.parallel!r}; choose one of: {', '.join(PARALLEL_MODES)}")
    if config.reduce_dtype not in REDUCE_DTYPES:
        raise UsageError(f"unknown --reduce-dtype {config.reduce_dtype!r}; choose one of: {', '.join(REDUCE_DTYPES)}")
    if config.nproc_per_node < 0:
        raise UsageError(f"--nproc-per-node must be >= 0 (0 = no re-launch), got {config.nproc_per_node}")
    if config.nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {config.nnodes}")
    if config.nproc_per_node > 0 and config.parallel == "none":
        raise UsageError(
            f"--nproc-per-node {config.nproc_per_node} starts {config.nproc_per_node} processes: "
            "add --parallel ddp or --parallel fsdp"
        )
    if config.parallel == "none":
        return
    for name, what in _SINGLE_PROCESS_ONLY.items():
        if getattr(config, name):
            raise UsageError(
                f"{what} runs in a single process only; drop it with --parallel {config.parallel}, "
                "or diagnose with 'ampkit doctor' / a --parallel none run"
            )
