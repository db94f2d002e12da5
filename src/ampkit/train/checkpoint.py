"""Checkpoints: everything needed to continue a run exactly, written so that a crash or a damaged
disk never gets a bad file loaded.

Layout: RUN_DIR/checkpoints/step-00000010.pt and its manifest step-00000010.json. The payload goes
to a temporary name, is fsync'ed and renamed into place (atomic on POSIX); then the manifest (sha256
of the payload, size, ampkit version, model/precision identity, step) is written the same way. A
checkpoint counts as complete only when its manifest exists, so a kill at any moment leaves at most
an ignored temporary file. Loading verifies the checksum: a truncated or bit-flipped file is refused
with the reason, never loaded. A write that fails (disk full, quota, file too large, read-only, I/O
error, whatever torch or the OS raises for it) removes what it wrote and raises
`CheckpointWriteFailed`; the previous checkpoint stays the latest.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import torch

from ampkit import __version__
from ampkit.errors import CheckpointWriteFailed, UsageError, WriteFailed
from ampkit.hardware.backend import capture_accelerator_rng, restore_accelerator_rng
from ampkit.runs import atomic_write, file_sha256, fsync_dir, make_dir, remove_quietly, write_failed

CHECKPOINT_DIR = "checkpoints"
FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:08d}.pt"


def manifest_path(path: Path) -> Path:
    return path.with_suffix(".json")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (payload and manifest both present), oldest first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found) if manifest_path(p).is_file()]


def capture_rng_state() -> dict[str, Any]:
    """Python's and torch's CPU generator, and the accelerator's generators under its device type
    ("cuda", the key checkpoints have always had, "xpu" or "mps"; `hardware.backend`)."""
    return {"python": random.getstate(), "torch": torch.get_rng_state(), **capture_accelerator_rng()}


def restore_rng_state(state: dict[str, Any]) -> None:
    """The inverse of `capture_rng_state`; an accelerator's states are restored where that accelerator
    is present (a CUDA checkpoint resumes on a CPU with its CPU generators only, as before)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    restore_accelerator_rng(state)


def _write_failed(run_dir: Path, step: int, err: WriteFailed) -> CheckpointWriteFailed:
    complete = list_checkpoints(run_dir)
    previous = f"step {int(complete[-1].stem.split('-')[1])}" if complete else "none yet"
    return CheckpointWriteFailed(
        err.path,
        err.reason,
        errno_code=err.errno_code,
        message=(
            f"checkpoint write at step {step} failed: cannot write {err.path}: {err.reason}; the previous "
            f"checkpoint ({previous}) stays the latest: free disk space or fix permissions, then "
            f"ampkit train --resume {run_dir}"
        ),
    )


def save_checkpoint(
    run_dir: Path, step: int, payload: dict[str, Any], *, keep: int, identity: dict[str, Any] | None = None
) -> Path:
    """Write `payload` atomically as the checkpoint for `step`, then its manifest; keep the newest `keep`.

    `identity` (e.g. model preset and precision) goes into the manifest and is checked on load.
    A failed write raises `CheckpointWriteFailed` after removing what it wrote (the payload when its
    manifest could not follow); the previous checkpoint stays the latest.
    """
    path = checkpoint_path(run_dir, step)
    full = {"format": FORMAT_VERSION, "ampkit_version": __version__, "step": step, **payload}
    published = False  # once the payload is in place, a failure removes it and its manifest
    try:
        make_dir(path.parent)
        for stale in [*path.parent.glob("step-*.pt.tmp"), *path.parent.glob("step-*.json.tmp")]:
            remove_quietly(stale)  # a write killed midway (one process per run directory: not a live one)
        with atomic_write(path) as fh:
            torch.save(full, fh)
        published = True
        manifest = {
            "format": FORMAT_VERSION,
            "ampkit_version": __version__,
            "step": step,
            "sha256": file_sha256(path),
            "bytes": path.stat().st_size,
            "identity": identity or {},
        }
        with atomic_write(manifest_path(path)) as fh:
            fh.write(json.dumps(manifest, indent=2).encode())
        fsync_dir(path.parent)
    except BaseException as err:
        if published or not manifest_path(path).is_file():  # never a manifest that does not match
            remove_quietly(manifest_path(path))
            remove_quietly(path)
        if isinstance(err, WriteFailed):
            raise _write_failed(run_dir, step, err) from err
        if isinstance(err, OSError):  # fsync_dir, the checksum read back
            raise _write_failed(run_dir, step, write_failed(path, err)) from err
        raise
    for old in list_checkpoints(run_dir)[:-keep]:  # the new checkpoint is complete and durable
        manifest_path(old).unlink(missing_ok=True)  # manifest first: a half-deleted checkpoint is incomplete
        old.unlink(missing_ok=True)
    return path


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        return json.loads(manifest_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(
            f"checkpoint manifest {manifest_path(path)} is missing or unreadable; delete "
            f"{path.name} to resume from an earlier checkpoint, or start a new run"
        ) from None


def verify_checkpoint(path: Path, *, identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check size, sha256 and identity against the manifest; return the manifest."""
    manifest = read_manifest(path)
    fix = f"delete {path.name} and its .json to resume from an earlier checkpoint, or start a new run"
    if path.stat().st_size != manifest.get("bytes") or file_sha256(path) != manifest.get("sha256"):
        raise UsageError(f"checkpoint {path} is corrupt or truncated (checksum mismatch); {fix}")
    for key, expected in (identity or {}).items():
        saved = manifest.get("identity", {}).get(key)
        if saved != expected:
            raise UsageError(
                f"checkpoint {path} does not match this run: it was made with {key}={saved!r}, "
                f"this run has {key}={expected!r}; resume with the same settings, or start a new run"
            )
    return manifest


def load_checkpoint(path: Path, *, identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """Verify, then load one checkpoint file (weights_only: no code runs from the file)."""
    verify_checkpoint(path, identity=identity)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a file that passed its checksum but was never a valid archive
        raise UsageError(f"checkpoint {path} is corrupt ({type(err).__name__}); start a new run") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise UsageError(f"{path} is not an ampkit checkpoint (format {FORMAT_VERSION}); start a new run")
    return state


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file's name says (step-00000010.pt: 10)."""
    return int(path.stem.split("-")[1])


def load_latest(
    run_dir: Path, *, identity: dict[str, Any] | None = None, at_or_before: int | None = None
) -> dict[str, Any]:
    """The newest complete checkpoint, or the newest at or before step `at_or_before`."""
    paths = list_checkpoints(run_dir)
    if at_or_before is not None:
        paths = [p for p in paths if checkpoint_step(p) <= at_or_before]
    if not paths:
        raise UsageError(f"{run_dir} has no complete checkpoint to resume from; start a new run with --out instead")
    return load_checkpoint(paths[-1], identity=identity)
