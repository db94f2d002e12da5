"""`ampkit bench --nproc-per-node N --parallel ddp|fsdp`: every precision's worker is N processes.

Each candidate still runs in its own fresh job, now `python -m torch.distributed.run --standalone
--nproc-per-node N -m ampkit.bench.worker JOB.json` (torchrun's launcher, as `ampkit train --nproc N`
uses it): N ranks on this node (gloo on the CPU, nccl on CUDA), every rank training under the same
sharding (DDP or FSDP2, `ampkit.distributed.wrap`), rank 0 reporting (progress, result, fidelity
capture). `--reduce-dtypes fp32,bf16` adds, for every precision but the reference, a candidate whose
gradients are reduced across the ranks in bf16 (`bf16-mixed%reduce=bf16`, `bench.candidates`): FSDP2's
`MixedPrecisionPolicy(reduce_dtype=)`, DDP's cast-and-all-reduce communication hook.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ampkit import options
from ampkit.bench.candidates import DEFAULT_REDUCE, REDUCE, candidate_reduce, candidate_spec
from ampkit.distributed.settings import REDUCE_DTYPES
from ampkit.errors import UsageError
from ampkit.options import PARALLEL_MODES


class Stoppable(Protocol):
    """A worker process: a `subprocess.Popen`, or a worker forked by the bench's warm process (`bench.zygote`)."""

    def kill(self) -> None: ...
    def send_signal(self, signum: int, /) -> None: ...
    def wait(self, timeout: float | None = None) -> int | Any: ...


LAUNCHER_GRACE_S = 45.0
"""After a hung job's SIGTERM, torchrun gives its ranks 30 s before SIGKILL: past this, it is killed too."""


@dataclass(frozen=True, kw_only=True)
class BenchParallel:
    """bench's `[parallel]`: the processes each precision's worker is, their sharding, the reduce dtypes."""

    parallel: str = options.parallel_field(note="each precision's worker is --nproc-per-node ranks under it")
    nproc_per_node: int = options.nproc_per_node_field(
        1, note="of each precision's worker, on this node; more than 1 needs --parallel", aliases=("nproc",)
    )
    reduce_dtypes: str = field(
        default="",
        metadata={
            "help": "comma-separated dtypes gradients are reduced in across the ranks, of "
            f"{', '.join(REDUCE_DTYPES)} ('' = fp32): bf16 adds, for every precision but fp32, a candidate "
            "whose gradients are reduced in bf16 (docs/bench.md)"
        },
    )

    def __post_init__(self) -> None:
        if self.parallel not in PARALLEL_MODES:
            raise UsageError(f"unknown --parallel {self.parallel!r}; choose one of: {', '.join(PARALLEL_MODES)}")
        n = self.nproc_per_node
        if n < 1:
            raise UsageError(f"--nproc-per-node must be >= 1 (processes per precision's worker), got {n}")
        if n > 1 and self.parallel == "none":
            raise UsageError(f"--nproc-per-node {n} runs each precision on {n} processes: add --parallel ddp or fsdp")
        if n == 1 and self.parallel != "none":
            raise UsageError(
                f"--parallel {self.parallel} shards each precision across processes: add --nproc-per-node 2 (or more)"
            )
        dtypes = self.reduce_dtype_list
        unknown = [d for d in dtypes if d not in REDUCE_DTYPES]
        if unknown:
            raise UsageError(f"unknown --reduce-dtypes {unknown[0]!r}; choose from: {', '.join(REDUCE_DTYPES)}")
        if n == 1 and dtypes != [DEFAULT_REDUCE]:
            raise UsageError(
                f"--reduce-dtypes {self.reduce_dtypes} is how gradients travel between processes: "
                "add --nproc-per-node 2 --parallel ddp (or fsdp)"
            )

    @property
    def distributed(self) -> bool:
        return self.nproc_per_node > 1

    @property
    def reduce_dtype_list(self) -> list[str]:
        """The reduce dtypes to compare, in the given order ([fp32] when none is given)."""
        names = [d.strip().lower() for d in self.reduce_dtypes.split(",") if d.strip()]
        return list(dict.fromkeys(names)) or [DEFAULT_REDUCE]


def refuse_ranks(settings: BenchParallel, mode: str) -> None:
    """`--sweep` and `--inference` run each candidate in one process: `--parallel` is one line, exit 2."""
    if settings.distributed:
        raise UsageError(f"{mode} runs each candidate in one process: drop --nproc-per-node and --parallel")


def with_reduce_dtypes(names: list[str], settings: BenchParallel) -> list[str]:
    """The candidates with `--reduce-dtypes` applied: each precision but the reference once per reduce
    dtype, in order (`bf16-mixed`, `bf16-mixed%reduce=bf16`); a name that carries its own keeps it.
    A reduce dtype in a one-process bench is refused (one line): nothing is reduced there."""
    dtypes = settings.reduce_dtype_list
    out: list[str] = []
    for name in names:
        if candidate_spec(name).is_reference or REDUCE in name:
            out.append(name)
            continue
        out += [name if d == DEFAULT_REDUCE else f"{name}{REDUCE}{d}" for d in dtypes]
    if not settings.distributed:
        reduced = next((n for n in out if candidate_reduce(n) != DEFAULT_REDUCE), None)
        if reduced is not None:
            raise UsageError(
                f"{reduced} reduces gradients across processes: add --nproc-per-node 2 --parallel ddp (or fsdp)"
            )
    if dtypes != [DEFAULT_REDUCE] and all(candidate_spec(n).is_reference for n in names):
        raise UsageError(
            "--reduce-dtypes varies the precisions besides fp32: add one, e.g. --precisions fp32,bf16-mixed"
        )
    return list(dict.fromkeys(out))


def train_flags(settings: BenchParallel, name: str) -> str:
    """train's flags for the sharding a candidate was measured under, with its reduce dtype ('' in one process)."""
    if not settings.distributed:
        return ""
    reduce = candidate_reduce(name)
    flags = f" --nproc-per-node {settings.nproc_per_node} --parallel {settings.parallel}"
    return flags + (f" --reduce-dtype {reduce}" if reduce != DEFAULT_REDUCE else "")


def parallel_block(settings: BenchParallel) -> dict[str, Any] | None:
    """summary["parallel"]: each precision's worker as ranks, or None (one process each). Items/s count
    every rank's items: the global batch is nproc_per_node x batch_size."""
    if not settings.distributed:
        return None
    return {
        "mode": settings.parallel,
        "nproc_per_node": settings.nproc_per_node,
        "reduce_dtypes": settings.reduce_dtype_list,
    }


def worker_command(job_path: Path, settings: BenchParallel) -> list[str]:
    """The worker's command line: one process, or torchrun's launcher starting N ranks on this node
    (a local rendezvous on a free port, the job stopped when one rank fails; `--max-restarts 0`)."""
    worker = ["-m", "ampkit.bench.worker", str(job_path)]
    if not settings.distributed:
        return [sys.executable, *worker]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(settings.nproc_per_node)]
    return [sys.executable, *launcher, "--max-restarts", "0", *worker]


def stop_hung(proc: Stoppable, *, distributed: bool) -> None:
    """End a worker that ran past its timeout. torchrun's ranks run in sessions of their own, so a
    SIGKILL to the launcher would orphan them: it gets SIGTERM (it stops every rank, SIGKILL after 30 s),
    then SIGKILL if it is still there after `LAUNCHER_GRACE_S`."""
    if not distributed:
        proc.kill()
        return
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=LAUNCHER_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
