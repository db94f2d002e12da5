"""Run directories: every command writes `runs/<time>-<command>/` (or `--out DIR`).

Nothing existing is overwritten: a directory that exists and is not empty is refused unless the
command is resuming into it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ampkit.errors import UsageError

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"


def default_run_dir(command: str, root: str | Path = "runs") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{stamp}-{command}"
    suffix = 1
    while path.exists():  # two runs in the same second get distinct directories
        suffix += 1
        path = Path(root) / f"{stamp}-{command}-{suffix}"
    return path


def create_run_dir(out: str | Path | None, command: str) -> Path:
    """Create a fresh run directory; refuse one that already holds files."""
    path = Path(out) if out else default_run_dir(command)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path} is a file, not a directory; choose another path")
    if path.is_dir() and any(path.iterdir()):
        raise UsageError(
            f"output directory {path} already exists and is not empty; "
            "choose another --out (or pass --resume to continue a training run)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create output directory {path}: {err.strerror}; choose a writable --out") from None
    return path


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write JSON through a temporary file and a rename, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=False, default=_json_default)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # 0-d tensors and numpy scalars
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


class MetricsWriter:
    """Appends one JSON object per line to `metrics.jsonl`; flushed per record."""

    def __init__(self, path: str | Path, *, append: bool = False):
        self.path = Path(path)
        self._fh = open(self.path, "a" if append else "w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, default=_json_default) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def truncate_metrics_after(path: str | Path, step: int) -> None:
    """Keep only records up to `step` (resuming from a checkpoint at `step` redoes later steps), and
    drop a torn last line left by a killed writer. Rewritten atomically."""
    path = Path(path)
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if record.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


_HASH_CHUNK_BYTES = 1 << 22  # 4 MiB reads while hashing


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable (the directory entry itself is fsync'ed)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
