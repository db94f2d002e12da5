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

Resume needs the same world size: DCP itself could reshard the model and optimizer to another
one, but the per-rank sampler positions and the global batch would not carry over.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampkit import __version__
from ampkit.errors import UsageError
from ampkit.runs import file_sha256, fsync_dir

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
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _own_files(folder: Path, rank: int) -> list[Path]:
    """The files this rank wrote: its DCP data files (`__RANK_*.distcp`) and its rank state."""
    return sorted(folder.glob(f"__{rank}_*.distcp")) + [folder / _rank_file(rank)]


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
    An OSError propagates; the previous checkpoint stays the latest.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = sharded_path(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if run.is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob("*.dcp.tmp"):  # left by a job that died mid-save
            shutil.rmtree(stale)
        tmp.mkdir()
    run.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp)
    _write_rank_state(tmp / _rank_file(run.rank), {"format": FORMAT, "step": step, **rank_state})
    files = run.all_gather_object(_describe(_own_files(tmp, run.rank)))  # every rank is done past here
    if run.is_main:
        _publish(tmp, final, files=files, step=step, world_size=run.world_size, mode=run.mode, identity=identity)
        _prune(run_dir, keep=keep)
    run.barrier()
    return final


def _publish(
    tmp: Path, final: Path, *, files: list[dict], step: int, world_size: int, mode: str, identity: dict[str, Any]
) -> None:
    """Rank 0: manifest last, then the rename that makes the checkpoint visible."""
    described = {name: info for per_rank in files for name, info in per_rank.items()}
    claimed = set(described) | {MANIFEST}
    described.update(_describe([p for p in sorted(tmp.iterdir()) if p.name not in claimed]))  # .metadata
    manifest = {
        "format": FORMAT,
        "ampkit_version": __version__,
        "step": step,
        "world_size": world_size,
        "parallel": mode,
        "identity": identity,
        "files": described,
    }
    with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
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
    if manifest["world_size"] != world_size:
        raise UsageError(
            f"checkpoint {path.name} was written by {manifest['world_size']} ranks and this job has "
            f"{world_size}: resume with --nproc {manifest['world_size']} (see docs/distributed.md)"
        )
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
    rank_state["step"] = manifest["step"]
    return rank_state


def latest_sharded(run_dir: Path) -> Path:
    paths = list_sharded(run_dir)
    if not paths:
        raise UsageError(f"{run_dir} has no complete sharded checkpoint to resume from; start a new run instead")
    return paths[-1]
