"""The process group of a data-parallel run, over the one-process "off" object
(`ampkit.core.parallel.LocalRun`, whose hooks it overrides).

torchrun (or `ampkit train --nproc N`, which calls torchrun's launcher) starts the processes and
tells each one who it is through its environment: RANK, LOCAL_RANK, WORLD_SIZE (plus MASTER_ADDR /
MASTER_PORT, read by `init_process_group` itself). That is the launcher's protocol, not a setting:
every choice the user makes is still a flag.

Backend: torch's default for the run's device: nccl on CUDA (RCCL under the same name on ROCm), xccl on
XPU, each rank on `<type>:LOCAL_RANK`; gloo on CPU. MPS has no collective backend: refused.
Rank 0 alone writes metrics, summaries and progress (`is_main`); every rank takes part in the
collectives below, at the same steps, or the job hangs -- callers must keep them unconditional.

A rank that never reaches a collective (hung, or dead without its connections closing) makes its
peers wait `--dist-timeout-s` (the process group's timeout, `init_process_group(timeout=...)`); each
waiting rank then fails saying so and, under `ampkit train --nproc N`, leaves a note in the
launcher's rank folder ($AMPKIT_RANK_DIR, `rank-R.json`) so the launcher names the rank that did
not come (`distributed.launch.describe_failures`). Under nccl the flight recorder is on
(TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT; a user's own values win): on a timeout
each rank dumps its last collectives to TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default /tmp/nccl_trace_rank_R).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from ampkit.core.counts import Counts
from ampkit.core.parallel import LocalRun
from ampkit.distributed.sampler import RankShardedSampler
from ampkit.errors import RunInterrupted, TrainingError, UsageError
from ampkit.hardware.backend import AcceleratorBackend

CLOSE_TIMEOUT_S = 300
"""How long a rank that finished cleanly waits at close for its peers to finish too (seconds)."""
RANK_DIR_ENV = "AMPKIT_RANK_DIR"
"""The folder where each rank of an `ampkit train --nproc N` job writes rank-R.json (pid; a peer timeout)."""
NCCL_FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
"""nccl's flight recorder: the last 2000 collectives per rank, dumped when the watchdog times one out.
Newer torch reads TORCH_FR_BUFFER_SIZE first and these names after it."""

# How a collective fails when a peer process died (gloo) or the network dropped (nccl, c10d store).
_PEER_LOST = ("closed by peer", "reset by peer", "remote worker", "broken pipe", "nccl", "timed out")


@dataclass(frozen=True, kw_only=True)
class LaunchEnv:
    """Who this process is, as torchrun's environment says."""

    rank: int
    """global rank, 0 .. world_size - 1"""
    local_rank: int
    """rank on this node: the CUDA device index"""
    world_size: int
    """processes in the job, all nodes"""


def launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """The torchrun environment of this process, or None when it was not started by torchrun."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    return LaunchEnv(
        rank=int(environ["RANK"]), local_rank=int(environ.get("LOCAL_RANK", "0")), world_size=int(environ["WORLD_SIZE"])
    )


class ProcessGroupRun(LocalRun):
    """One rank of a torchrun job. `wrap_model` sets `grad_sync`; `build_run` sets `sampler`."""

    distributed = True

    def __init__(self, *, mode: str, env: LaunchEnv, device: torch.device, backend: str, reduce_dtype: str):
        self.mode, self.device, self.backend, self.reduce_dtype = mode, device, backend, reduce_dtype
        self.rank, self.local_rank, self.world_size = env.rank, env.local_rank, env.world_size
        self.grad_sync: Callable[[bool], contextlib.AbstractContextManager] = lambda last: contextlib.nullcontext()
        # It knows every rank's token counts without a collective.
        self.sampler: RankShardedSampler | None = None

    def micro_batch_context(self, *, last: bool) -> contextlib.AbstractContextManager:
        return self.grad_sync(last)

    def step_counts(self, counts: Counts) -> Counts:
        # Every rank reads the same seeded stream, so it knows the others' counts: no sync needed.
        assert self.sampler is not None, "build_run sets the sampler before the first step"
        return self.sampler.take_step_counts()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        total = value.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)  # gloo has no AVG: sum, then divide
        return total / self.world_size

    def agreed_signal(self, signum: int | None, *, check: bool) -> int | None:
        import torch.distributed as dist

        if not check:
            return None
        flag = torch.tensor([signum or 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) or None  # sync point (log steps only)

    def all_true(self, flag: bool) -> bool:
        import torch.distributed as dist

        value = torch.tensor([0 if flag else 1], dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item()) == 0  # sync point

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "world_size": self.world_size,
            "backend": self.backend,
            "reduce_dtype": self.reduce_dtype,
        }

    def close(self, *, clean: bool = True) -> None:
        """Tear the group down. After a run that ended normally (`clean`) every rank first meets at a
        barrier: a rank that destroyed the group while a peer still had a collective in flight would
        abort that peer ("terminate called without an active exception" from gloo). After an error
        there is no barrier: the failing rank leaves, and the launcher stops its peers."""
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                if clean:
                    dist.barrier()
                    self._meet_on_store()
            finally:
                dist.destroy_process_group()

    def _meet_on_store(self) -> None:
        """Wait until every rank has left the barrier, meeting on the rendezvous store (not on the
        group's own connections). Gloo's barrier can return on one rank while its last messages are
        still in flight to a peer; destroying the group then closes those connections under the peer,
        which aborts ("terminate called without an active exception"; gloo issue 155, barrier followed
        by context destruction). Once each rank's key is in the store, no rank has a collective left."""
        import datetime

        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()  # the default group's store (c10d has no public getter)
        store.set(f"ampkit/left-barrier/{self.rank}", "1")
        keys = [f"ampkit/left-barrier/{rank}" for rank in range(self.world_size)]
        store.wait(keys, datetime.timedelta(seconds=CLOSE_TIMEOUT_S))


def init_run(
    *, parallel: str, device: torch.device, reduce_dtype: str = "fp32", timeout_s: float = 600.0
) -> tuple[LocalRun, torch.device]:
    """Join the torchrun job (or return the one-process object) and this rank's device; a collective
    waits at most `timeout_s` seconds for a peer.

    Precondition: called once, before any model is built (the device may change to cuda:LOCAL_RANK).
    """
    env = launch_env()
    if parallel == "none":
        if env is not None and env.world_size > 1:
            raise UsageError(
                f"this process is one of {env.world_size} started by torchrun, but --parallel is "
                "none (every rank would train alone): add --parallel ddp or --parallel fsdp"
            )
        return LocalRun(), device
    if env is None:
        raise UsageError(
            f"--parallel {parallel} runs one process per device: launch with 'ampkit train --nproc-per-node N "
            f"--parallel {parallel} ...' or 'torchrun --nproc-per-node N -m ampkit train ...'"
        )
    backend = _collective_backend(device)  # before any device work: MPS is refused here
    device = _rank_device(device, env)
    import torch.distributed as dist

    if backend == "nccl":  # read when the nccl group is made: set before it
        set_flight_recorder_env(os.environ)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            rank=env.rank,
            world_size=env.world_size,
            device_id=device if device.type != "cpu" else None,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    leave_rank_note(env.rank, timeout_s=timeout_s)
    run = ProcessGroupRun(mode=parallel, env=env, device=device, backend=backend, reduce_dtype=reduce_dtype)
    return run, device


def set_flight_recorder_env(environ: MutableMapping[str, str]) -> None:
    """Turn nccl's flight recorder on in `environ`, unless the user set its buffer (either name) or
    its dump switch: their values win."""
    if "TORCH_FR_BUFFER_SIZE" in environ:
        return
    for name, value in NCCL_FLIGHT_RECORDER.items():
        environ.setdefault(name, value)


def _collective_backend(device: torch.device) -> str:
    """torch's default process-group backend for the device type (cpu: gloo, cuda: nccl, xpu: xccl)."""
    import torch.distributed as dist

    if device.type == "mps":  # torch maps mps to gloo, whose collectives take CPU and CUDA tensors only
        raise UsageError(
            "--parallel needs a collective backend for MPS tensors, and torch has none: train in one "
            "process (--parallel none), or on CUDA, XPU or CPU ranks"
        )
    return dist.get_default_backend_for_device(device)


def _rank_device(device: torch.device, env: LaunchEnv) -> torch.device:
    """An accelerator -> <type>:LOCAL_RANK (and made current); CPU ranks share the CPU."""
    if device.type == "cpu":
        return device
    visible = AcceleratorBackend(device).device_count()
    if env.local_rank >= visible:
        raise UsageError(
            f"local rank {env.local_rank} needs {device.type} device {env.local_rank}, but this node shows "
            f"{visible}: start at most {visible} processes per node (--nproc / --nproc-per-node)"
        )
    device = torch.device(device.type, env.local_rank)
    AcceleratorBackend(device).make_current()
    return device


def shared_run_dir(run: LocalRun, make: Callable[[], Any]) -> Any:
    """`make()` (e.g. create the run directory) on rank 0 alone; its result on every rank.
    A UsageError on rank 0 is raised on every rank, so no rank waits for a directory that never comes."""
    if not run.distributed:
        return make()
    outcome: tuple[Any, str | None] | None = None
    if run.is_main:
        try:
            outcome = (make(), None)
        except UsageError as err:
            outcome = (None, str(err))
    value, error = run.broadcast_object(outcome)
    if error:
        raise UsageError(error)
    return value


def leave_rank_note(rank: int, **facts: Any) -> None:
    """rank-R.json in the launcher's rank folder (none: no note): this rank's pid and `facts`, added
    to its earlier note. Written whole and renamed, so the launcher never reads half a note."""
    folder = os.environ.get(RANK_DIR_ENV)
    if not folder:
        return
    path = os.path.join(folder, f"rank-{rank}.json")
    note = {**read_rank_notes(folder).get(rank, {}), "rank": rank, "pid": os.getpid(), **facts}
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            json.dump(note, out)
        os.replace(path + ".tmp", path)
    except OSError:  # the note only sharpens the launcher's message: never fail a rank over it
        pass


def read_rank_notes(folder: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """rank -> its note (`leave_rank_note`) in `folder`; a missing or torn note is left out."""
    notes: dict[int, dict[str, Any]] = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    note = json.load(f)
                notes[int(note["rank"])] = note
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return notes


def rank_error(err: Exception, *, rank: int) -> Exception:
    """`err` with this rank named, for the one-line message each rank prints; a collective that
    failed because a peer died or never came becomes a TrainingError saying so, and a note for the
    launcher (`leave_rank_note`: lost_contact or timed_out). Other errors come back unchanged."""
    if isinstance(err, RunInterrupted):
        return RunInterrupted(f"rank {rank}: {err}", signum=err.signum)
    if isinstance(err, (UsageError, TrainingError)):
        return type(err)(f"rank {rank}: {err}")
    first = (str(err).strip().splitlines() or [""])[0]
    if "timed out" in first.lower():
        leave_rank_note(rank, timed_out=True)
        return TrainingError(
            f"rank {rank}: timed out waiting for another rank at a collective ({first[:120]}); the job "
            "stops: the launcher names the rank that did not come (--dist-timeout-s sets the wait)"
        )
    if type(err).__name__.startswith("Dist") or any(s in first.lower() for s in _PEER_LOST):
        leave_rank_note(rank, lost_contact=True)  # not a root cause: the launcher names the others first
        return TrainingError(
            f"rank {rank}: lost contact with another rank ({first[:160]}); the job stops: the rank "
            "that failed first printed its own error"
        )
    return err
