"""Checkpoints: everything needed to continue a run exactly, written so a crash never leaves a
half-written file under a checkpoint's name.

Layout: RUN_DIR/checkpoints/step-00000010.pt. A write goes to a temporary name in the same
directory, is fsync'ed, renamed into place (atomic on POSIX), and the directory is fsync'ed so
the rename itself survives a power loss. The newest file that loads is the latest checkpoint.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import torch

from ampkit import __version__
from ampkit.errors import UsageError

CHECKPOINT_DIR = "checkpoints"
FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:08d}.pt"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (temporary files excluded), oldest first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def capture_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_python_random_state(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_random_state(state):
    version, internal, gauss = state
    return version, tuple(internal), gauss


def save_checkpoint(run_dir: Path, step: int, payload: dict[str, Any], *, keep: int) -> Path:
    """Write `payload` atomically as the checkpoint for `step`; keep only the newest `keep`."""
    path = checkpoint_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    full = {"format": FORMAT_VERSION, "ampkit_version": __version__, "step": step, **payload}
    with open(tmp, "wb") as fh:
        torch.save(full, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load one checkpoint file; refuse (UsageError) anything that is not a complete ampkit checkpoint."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated/corrupt archives
        raise UsageError(
            f"checkpoint {path} is corrupt or truncated ({type(err).__name__}); delete it to resume "
            "from an earlier checkpoint, or start a new run"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise UsageError(f"{path} is not an ampkit checkpoint (format {FORMAT_VERSION}); start a new run")
    return state


def load_latest(run_dir: Path) -> dict[str, Any]:
    paths = list_checkpoints(run_dir)
    if not paths:
        raise UsageError(f"{run_dir} has no checkpoint to resume from; start a new run with --out instead")
    return load_checkpoint(paths[-1])
