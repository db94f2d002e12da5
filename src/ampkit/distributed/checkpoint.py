"""Sharded checkpoints through `torch.distributed.checkpoint` (DCP), complete or invisible.

Layout of one checkpoint, a directory RUN_DIR/checkpoints/step-00000010.dcp/:
    .metadata, __0_0.distcp, __1_0.distcp ...   DCP: model + optimizer, each rank writes its shards
    rank-00000.pt, rank-00001.pt ...            per rank: sampler position, RNG, scheduler, scaler, counters
    manifest.json                               written last: sha256 and size of every file above
How "complete" is guaranteed: every rank writes into `step-00000010.dcp.tmp/`; after all ranks
have reported their files' checksums (a collective, so every rank has finished), rank 0 writes the
manifest and renames the directory to its final name. Only a directory with the final name *and*
a manifest counts. A rank that dies at any moment leaves a `.tmp` directory no resume reads (the
next save removes it). Checksums are verified on load, each rank taking a share of the files.

A write that fails on any rank (disk full, quota, read-only, I/O error; DCP's own
CheckpointException carries each rank's cause) fails the save on every rank alike: the outcome of
each step is shared (a gather, a broadcast), the `.tmp` directory is removed and every rank raises
`CheckpointWriteFailed`, naming the rank, the file and the cause. No rank waits for one that gave up.

Resume needs the same world size: DCP itself could reshard the model and optimizer to another
one, but the per-rank sampler positions and the global batch would not carry over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit import __version__
from ampkit.errors import CheckpointWriteFailed, UsageError, as_write_failed, exception_chain
from ampkit.runs import atomic_write, file_sha256, fsync_dir

CHECKPOINT_DIR = "checkpoints"
FORMAT = "ampkit-dcp-1"
MANIFEST = "manifest.json"
_NAME = re.compile(r"^step-(\d{8})\.dcp$")


def sharded_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:08d}.dcp"


def list_sharded(run_dir: Path) -> list[Path]:
    """Complete sharded checkpoints (final name and manifest), oldest first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found) if (p / MANIFEST).is_file()]


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _write_rank_state(path: Path, state: dict[str, Any]) -> None:
    with atomic_write(path) as fh:
        torch.save(state, fh)


def _own_files(folder: Path, rank: int) -> list[Path]:
    """The files this rank wrote: its DCP data files (`__RANK_*.distcp`) and its rank state."""
    return [*sorted(folder.glob(f"__{rank}_*.distcp")), folder / _rank_file(rank)]


def _describe(paths: list[Path]) -> dict[str, dict[str, Any]]:
    return {p.name: {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in paths}


def save_sharded(
    run,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rank_state: dict[str, Any],
    run_dir: Path,
    step: int,
    keep: int,
    identity: dict[str, Any],
) -> Path:
    """Every rank calls this at the same step (collectives inside). Returns the final path.

    `rank_state` is this rank's non-tensor-parallel state (sampler, RNG, scheduler, scaler, counters).
    A failed write on any rank raises `CheckpointWriteFailed` on every rank, after the `.tmp`
    directory is removed; the previous checkpoint stays the latest.
    """
    final = sharded_path(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    prepared = _attempt(tmp, run.rank, _prepare, tmp) if run.is_main else None
    _agree(run, run_dir, step, tmp, [run.broadcast_object(prepared)])
    outcomes = run.all_gather_object(_attempt(tmp, run.rank, _write_shards, run, model, optimizer, rank_state, tmp))
    _agree(run, run_dir, step, tmp, outcomes)  # every rank is done writing past the gather
    published = _attempt(tmp, 0, _publish, tmp, final, outcomes, step, run, identity) if run.is_main else None
    _agree(run, run_dir, step, tmp, [run.broadcast_object(published)])
    if run.is_main:
        with contextlib.suppress(OSError):  # the new checkpoint is complete: pruning is housekeeping
            _prune(run_dir, keep=keep)
    return final


def _prepare(tmp: Path) -> None:
    """Rank 0, before any rank writes: a fresh `.tmp` directory (a job that died mid-save left debris)."""
    tmp.parent.mkdir(parents=True, exist_ok=True)
    for stale in tmp.parent.glob("*.dcp.tmp"):
        shutil.rmtree(stale)
    tmp.mkdir()


def _write_shards(run, model, optimizer, rank_state: dict[str, Any], tmp: Path) -> dict[str, dict]:
    """This rank's DCP shards and its rank state; returns their checksums for the manifest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    # An optimizer that has not stepped yet (the guard's step-0 checkpoint) has no state, and
    # get_state_dict makes some with a zero-lr step: AdamW's weights stay, but its step count becomes
    # 1, which shifts every later bias correction. So the made state is dropped again after the save,
    # and the checkpoint says the optimizer was fresh (`load_sharded` drops it after loading too).
    fresh = not optimizer.state
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp)
    if fresh:
        optimizer.state.clear()
    _write_rank_state(tmp / _rank_file(run.rank), {"format": FORMAT, "optimizer_fresh": fresh, **rank_state})
    return _describe(_own_files(tmp, run.rank))


@dataclasses.dataclass(frozen=True)
class _Failed:
    """A failure to write, as one rank shares it with the others (picklable)."""

    rank: int
    path: str
    reason: str


def _attempt(tmp: Path, rank: int, fn, *args) -> Any:
    """`fn(*args)`, a failure to write coming back as a `_Failed` instead of raised, so it can be
    shared with the other ranks; any other error propagates."""
    try:
        return fn(*args)
    except BaseException as err:  # DCP's CheckpointException derives from BaseException
        causes = [exc for exc, _ in getattr(err, "failures", {}).values()]  # DCP: each rank's own error
        for cause in (err, *causes):
            failure = as_write_failed(tmp, cause)
            if failure is not None:
                return _Failed(rank=rank, path=_failed_file(cause) or failure.path, reason=failure.reason)
        raise


def _failed_file(err: BaseException) -> str | None:
    """The file an OSError in `err`'s chain names, if any."""
    return next((str(e.filename) for e in exception_chain(err) if isinstance(e, OSError) and e.filename), None)


def _agree(run, run_dir: Path, step: int, tmp: Path, outcomes: list[Any]) -> None:
    """Every rank raises the same `CheckpointWriteFailed` for the first failure any rank met; rank 0
    removes the `.tmp` directory first (every rank is past its writes when outcomes are shared)."""
    failure = next((o for o in outcomes if isinstance(o, _Failed)), None)
    if failure is None:
        return
    if run.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    latest = list_sharded(run_dir)
    previous = f"step {int(latest[-1].name[5:13])}" if latest else "none yet"  # step-00000010.dcp
    raise CheckpointWriteFailed(
        failure.path,
        failure.reason,
        message=(
            f"sharded checkpoint write at step {step} failed on rank {failure.rank}: cannot write "
            f"{failure.path}: {failure.reason}; the previous checkpoint ({previous}) stays the latest: "
            f"free disk space or fix permissions, then ampkit train --resume {run_dir}"
        ),
    )


def _publish(tmp: Path, final: Path, files: list[dict], step: int, run, identity: dict[str, Any]) -> None:
    """Rank 0: manifest last, then the rename that makes the checkpoint visible."""
    described = {name: info for per_rank in files for name, info in per_rank.items()}
    claimed = set(described) | {MANIFEST}
    described.update(_describe([p for p in sorted(tmp.iterdir()) if p.name not in claimed]))  # .metadata
    manifest = {
        "format": FORMAT,
        "ampkit_version": __version__,
        "step": step,
        "world_size": run.world_size,
        "parallel": run.mode,
        "identity": identity,
        "files": described,
    }
    with atomic_write(tmp / MANIFEST) as fh:
        fh.write(json.dumps(manifest, indent=2).encode("utf-8"))
    fsync_dir(tmp)
    if final.exists():  # the same step written again after a resume from an earlier checkpoint
        (final / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def _prune(run_dir: Path, *, keep: int) -> None:
    for old in list_sharded(run_dir)[:-keep]:
        (old / MANIFEST).unlink()  # manifest first: a half-deleted checkpoint is incomplete
        shutil.rmtree(old)


def read_sharded_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(
            f"checkpoint {path} has no readable {MANIFEST}; delete it to resume from an earlier "
            "checkpoint, or start a new run"
        ) from None
    if manifest.get("format") != FORMAT:
        raise UsageError(f"{path} is not an ampkit sharded checkpoint ({FORMAT}); start a new run")
    return manifest


def _check_manifest(manifest: dict[str, Any], path: Path, *, world_size: int, identity: dict[str, Any]) -> None:
    _check_world_size(manifest, path, world_size=world_size)
    _check_identity(manifest, path, identity=identity)


def _check_world_size(manifest: dict[str, Any], path: Path, *, world_size: int) -> None:
    if manifest["world_size"] != world_size:
        raise UsageError(
            f"checkpoint {path.name} was written by {manifest['world_size']} ranks and this job has "
            f"{world_size}: resume with --nproc-per-node {manifest['world_size']} (see docs/distributed.md)"
        )


def check_resume_world_size(run_dir: Path, *, world_size: int) -> None:
    """Refuse a resume at another world size than the newest complete sharded checkpoint's, before
    any rank starts (`ampkit train --resume RUN_DIR --nproc N`: one line, not one per rank). A run
    with no sharded checkpoint passes: the ranks say what is missing."""
    paths = list_sharded(run_dir)
    if paths:
        _check_world_size(read_sharded_manifest(paths[-1]), paths[-1], world_size=world_size)


def _check_identity(manifest: dict[str, Any], path: Path, *, identity: dict[str, Any]) -> None:
    for key, expected in identity.items():
        saved = manifest.get("identity", {}).get(key)
        if saved != expected:
            raise UsageError(
                f"checkpoint {path} does not match this run: it was made with {key}={saved!r}, this run "
                f"has {key}={expected!r}; resume with the same settings, or start a new run"
            )


def _corrupt_files(path: Path, manifest: dict[str, Any], *, rank: int, world_size: int) -> list[str]:
    """This rank's share of the checksum work: every world_size-th file of the manifest."""
    bad = []
    for name in sorted(manifest["files"])[rank::world_size]:
        file, expected = path / name, manifest["files"][name]
        if not file.is_file() or file.stat().st_size != expected["bytes"] or file_sha256(file) != expected["sha256"]:
            bad.append(name)
    return bad


def load_sharded(
    run, *, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path, identity: dict[str, Any]
) -> dict[str, Any]:
    """Verify, load model and optimizer shards in place, and return this rank's state (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    manifest = read_sharded_manifest(path)
    _check_manifest(manifest, path, world_size=run.world_size, identity=identity)
    bad = sorted(
        n
        for names in run.all_gather_object(_corrupt_files(path, manifest, rank=run.rank, world_size=run.world_size))
        for n in names
    )
    if bad:
        raise UsageError(
            f"checkpoint {path} is corrupt or truncated ({', '.join(bad)} fail their checksum); "
            "delete it to resume from an earlier checkpoint, or start a new run"
        )
    # The optimizer's state must exist to be loaded into: get_state_dict creates it (a zero-lr step).
    model_state, optim_state = get_state_dict(model, optimizer)
    # dcp.load fills the nested state dicts in place (it may replace their non-tensor entries).
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rank_state = torch.load(path / _rank_file(run.rank), map_location="cpu", weights_only=True)
    if rank_state.get("optimizer_fresh"):  # written before the first step: no state, as then
        optimizer.state.clear()
    rank_state["step"] = manifest["step"]
    return rank_state


def read_sharded_model(path: Path, *, identity: dict[str, Any]) -> tuple[dict[str, torch.Tensor], int]:
    """A sharded checkpoint's model weights, whole, in this one process (no process group; `train
    --export`): the manifest checked (identity, every file's checksum), then each model tensor read
    from all ranks' shards at its saved shape and dtype (the training storage dtype: DCP's metadata
    says it). Returns (state dict by the module's names, step). Optimizer state is not read."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    manifest = read_sharded_manifest(path)
    _check_identity(manifest, path, identity=identity)
    bad = _corrupt_files(path, manifest, rank=0, world_size=1)
    if bad:
        raise UsageError(
            f"checkpoint {path} is corrupt or truncated ({', '.join(bad)} fail their checksum); "
            "delete it to export an earlier checkpoint"
        )
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    template = {  # "model.<name>": DCP flattens the {"model": ..., "optimizer": ...} dict that was saved
        key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in saved.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    state = {"model": template}
    with warnings.catch_warnings():  # "torch.distributed is not initialized": one process reads it all, as meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=path)
    return state["model"], int(manifest["step"])


def read_sharded_whole(
    path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, identity: dict[str, Any]
) -> dict[str, Any]:
    """A sharded checkpoint read whole into a one-process model and optimizer (no process group: `doctor
    --from` of a data-parallel run): the manifest checked (identity, every file's checksum), the model and
    optimizer state read from all ranks' shards at their full shapes, and rank 0's state returned (the
    data position, RNG, schedule and scaler are the same on every rank) with the step and world size."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    manifest = read_sharded_manifest(path)
    _check_identity(manifest, path, identity=identity)
    bad = _corrupt_files(path, manifest, rank=0, world_size=1)
    if bad:
        raise UsageError(f"checkpoint {path} is corrupt or truncated ({', '.join(bad)} fail their checksum)")
    model_state, optim_state = get_state_dict(model, optimizer)  # creates the optimizer's state to load into
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    with warnings.catch_warnings():  # "torch.distributed is not initialized": one process reads it all, as meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rank_state = torch.load(path / _rank_file(0), map_location="cpu", weights_only=True)
    if rank_state.get("optimizer_fresh"):
        optimizer.state.clear()
    return rank_state | {"step": manifest["step"], "world_size": manifest["world_size"]}


def sharded_world_size(path: Path) -> int:
    """The ranks that wrote a sharded checkpoint (its manifest)."""
    return int(read_sharded_manifest(path)["world_size"])


def latest_sharded(run_dir: Path, *, at_or_before: int | None = None) -> Path:
    """The newest complete sharded checkpoint, or the newest at or before step `at_or_before`."""
    paths = [p for p in list_sharded(run_dir) if at_or_before is None or int(p.name[5:13]) <= at_or_before]
    if not paths:
        raise UsageError(f"{run_dir} has no complete sharded checkpoint to resume from; start a new run instead")
    return paths[-1]
