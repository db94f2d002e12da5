"""Run directories: every command writes `runs/<time>-<command>/` (or `--out DIR`).

Nothing existing is overwritten: a directory that exists and is not empty is refused unless the
command is resuming into it. One process at a time writes into a run directory: it holds an
advisory lock (`flock` on RUN_DIR/.lock, released by the kernel when the process ends, however it
ends), and a second process is refused at once with the holder's pid and host.

Every file is written whole or not at all (a temporary name, fsync, rename). A failure to write
(disk full, quota, file too large, read-only, I/O error: whatever torch or the OS raises for it)
removes the temporary file and raises `WriteFailed`, one line naming the file and the cause.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ampkit.errors import UsageError, WriteFailed, as_write_failed

if TYPE_CHECKING:
    from rich.console import Console

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
LOCK_FILE = ".lock"


def default_run_dir(command: str, root: str | Path = "runs") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{stamp}-{command}"
    suffix = 1
    while path.exists():  # two runs in the same second get distinct directories
        suffix += 1
        path = Path(root) / f"{stamp}-{command}-{suffix}"
    return path


def create_run_dir(out: str | Path | None, command: str) -> Path:
    """Create a fresh run directory and lock it (`lock_run_dir`); refuse one that already holds files."""
    path = Path(out) if out else default_run_dir(command)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path} is a file, not a directory; choose another path")
    _refuse_if_not_empty(path, command)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        failure = write_failed(path, err)
        raise WriteFailed(
            path, failure.reason, errno_code=failure.errno_code, message=f"{failure}; choose a writable --out"
        ) from None
    lock_run_dir(path, command=command)
    try:
        _refuse_if_not_empty(path, command)  # again, under the lock: another process may have written into it meanwhile
    except UsageError:
        release_run_dir(path)
        raise
    return path


def _refuse_if_not_empty(path: Path, command: str) -> None:
    if path.is_dir() and any(p.name != LOCK_FILE for p in path.iterdir()):
        resume = " (or pass --resume to continue a training run)" if command == "train" else ""  # train's flag only
        raise UsageError(f"output directory {path} already exists and is not empty; choose another --out{resume}")


# -- writing files: whole or not at all ----------------------------------------------------------
@contextlib.contextmanager
def atomic_write(path: str | Path, *, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Open `path` for writing through `path.tmp`, which is flushed, fsync'ed and renamed into place
    when the block ends. Any failure removes the temporary file; a failure to write (any OSError,
    torch's zip-writer errors: `ampkit.errors.write_error_reason`) raises `WriteFailed` naming
    `path`; other exceptions pass through unchanged."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, mode, encoding=encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        remove_quietly(tmp)
        failure = as_write_failed(path, err)
        if failure is None:
            raise
        raise failure from err


def remove_quietly(path: str | Path) -> None:
    """Remove a partial file; a file system that refuses even that (read-only) keeps it."""
    with contextlib.suppress(OSError):
        Path(path).unlink(missing_ok=True)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_write(path) as fh:
        fh.write(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_failed(path: str | Path, err: OSError) -> WriteFailed:
    """An OSError met while writing `path`, as the `WriteFailed` the CLI reports."""
    failure = as_write_failed(path, err)
    return failure if failure is not None else WriteFailed(path, str(err))


def make_dir(path: str | Path) -> Path:
    """`mkdir -p`; a failure raises `WriteFailed`."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise write_failed(path, err) from None
    return path


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write JSON through a temporary file and a rename, so a reader never sees half a file."""
    write_text_atomic(path, json_text(payload))  # a bad value: no file


def json_text(payload: Any) -> str:
    """summary.json's text: indented JSON, Paths as strings, 0-d tensors and numpy scalars as numbers."""
    return json.dumps(payload, indent=2, sort_keys=False, default=_json_default) + "\n"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # 0-d tensors and numpy scalars
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def say(line: str, console: Console | None = None) -> None:
    """One line on stderr (through a rich console when given, which keeps progress bars intact)."""
    if console is not None:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    else:
        print(line, file=sys.stderr)


def write_summary_or_say(path: str | Path, summary: dict[str, Any], console: Console | None = None) -> bool:
    """Write a run's summary when there is room; otherwise say so in one line (stderr, or `console`)
    and return False. Meant for the summary of a run that fails anyway: the run's own error is the
    message that matters, and the caller raises it next."""
    try:
        write_json_atomic(path, summary)
    except WriteFailed as err:
        say(f"note: {path} could not be written ({err.reason})", console)
        return False
    return True


@contextlib.contextmanager
def summary_marks_write_failure(run_dir: str | Path, command: str, console: Console | None = None) -> Iterator[None]:
    """Around a command's writes: a `WriteFailed` marks summary.json `"status": "failed"` with the
    reason (keeping what an already written summary holds), when there is room, then propagates."""
    try:
        yield
    except WriteFailed as err:
        path = Path(run_dir) / SUMMARY_FILE
        summary: dict[str, Any] = {"command": command}
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(path.read_text(encoding="utf-8"))
            summary = loaded if isinstance(loaded, dict) else summary
        summary.update(status="failed", error=str(err))
        write_summary_or_say(path, summary, console)
        raise


class MetricsWriter:
    """Appends one JSON object per line to `metrics.jsonl`, each line written straight to the file.

    A line that cannot be written (disk full, file too large) is cut off again, so the file holds
    whole lines only, and `WriteFailed` is raised. The run stops on that error; records written
    after it (the run's closing evaluation) are dropped rather than failing a second time."""

    def __init__(self, path: str | Path, *, append: bool = False):
        self.path = Path(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as err:
            raise write_failed(self.path, err) from None
        self.failed: WriteFailed | None = None

    def write(self, record: dict[str, Any]) -> None:
        if self.failed is not None or self._fd < 0:
            return
        data = memoryview((json.dumps(record, default=_json_default) + "\n").encode("utf-8"))
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)  # no torn line left behind
            self.failed = write_failed(self.path, err)
            raise self.failed from None

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
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
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def read_json(path: Path, *, remedy: str) -> Any:
    """A JSON file a command was pointed at; not JSON (or not UTF-8) is a `UsageError` ending in `remedy`."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{path} is not valid JSON ({err}); {remedy}") from None


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


# -- one process per run directory ---------------------------------------------------------------
HOLDER_READ_S = 0.5  # a holder writes its pid right after locking: wait up to this long to read it
_HELD: dict[str, RunDirLock] = {}


class RunDirLock:
    """An exclusive `flock` on RUN_DIR/.lock, held by this process until `release` or its end."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self.path, self.fd = run_dir, run_dir / LOCK_FILE, fd

    def release(self) -> None:
        """Remove the lock file (while it is still ours), then let go of the lock."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            if _same_file(self.fd, self.path):
                self.path.unlink()
        os.close(self.fd)
        self.fd = -1


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holder_text(path: Path) -> str:
    deadline = time.monotonic() + HOLDER_READ_S
    while True:
        try:
            holder = json.loads(path.read_text(encoding="utf-8"))
            return f"pid {holder['pid']} on {holder['host']} ({holder['command']}, started {holder['started']})"
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                return "another process (its pid could not be read)"
            time.sleep(0.02)


def _write_holder(fd: int, command: str) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": f"ampkit {command}",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    with contextlib.suppress(OSError):  # a full disk: the lock holds all the same, its holder unnamed
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode("utf-8"), 0)


def lock_run_dir(run_dir: str | Path, *, command: str) -> RunDirLock:
    """Take RUN_DIR's lock for this process, or refuse (UsageError, exit 2) naming the holder.

    Non-blocking: a second process is refused at once. The kernel drops the lock when its holder
    ends, even by SIGKILL, so a lock is never stale. Taking it again in the same process is a
    no-op. A lock file replaced while we opened it (its holder released it) is tried again, so two
    processes never both hold one."""
    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    if key in _HELD:
        return _HELD[key]
    path = run_dir / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise write_failed(path, err) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise write_failed(path, err) from None
            raise UsageError(f"{run_dir} is in use by {_holder_text(path)}; wait for it to finish or stop it") from None
        if _same_file(fd, path):
            break
        os.close(fd)
    _write_holder(fd, command)
    lock = _HELD[key] = RunDirLock(run_dir, fd)
    return lock


def release_run_dir(run_dir: str | Path) -> None:
    lock = _HELD.pop(str(Path(run_dir).resolve()), None)
    if lock is not None:
        lock.release()


def release_run_dirs() -> None:
    """Release every run-directory lock this process holds (the CLI does, when a command ends)."""
    for key in list(_HELD):
        _HELD.pop(key).release()


def lock_resumed_run(run_dir: str | Path, *, nproc: int | None = None) -> None:
    """`ampkit train --resume RUN_DIR`: lock RUN_DIR in the process that will train as rank 0.

    A one-process run locks here; under torchrun only rank 0 does; torchrun's launcher (`--nproc`,
    from the flag or the saved config) leaves it to its rank 0. A folder that is not a train run
    is left alone: the command refuses it with its own message."""
    run_dir = Path(run_dir)
    saved = run_dir / "config.json"
    if not saved.is_file():
        return
    if nproc is None and "RANK" not in os.environ:
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            saved_config = json.loads(saved.read_text(encoding="utf-8"))  # "nproc": a run saved before the rename
            nproc = int(saved_config.get("nproc_per_node", saved_config.get("nproc")) or 0)
    if _trains_as_rank_0(nproc):
        lock_run_dir(run_dir, command="train --resume")


def lock_fresh_out(out: str | Path, *, nproc: int | None = None) -> None:
    """`ampkit train --out DIR` where DIR exists and is empty: lock it now, before the model is built
    (`create_run_dir` takes the same lock again later, a no-op). Other folders are left to
    `create_run_dir`: one that does not exist yet is made there, a non-empty one refused there."""
    out = Path(out)
    if out.is_dir() and not any(p.name != LOCK_FILE for p in out.iterdir()) and _trains_as_rank_0(nproc):
        lock_run_dir(out, command="train")


def _trains_as_rank_0(nproc: int | None) -> bool:
    """Whether this process will train as rank 0: a one-process run, or rank 0 under torchrun; not
    torchrun's launcher (`--nproc N`), which leaves the lock to its rank 0."""
    rank = os.environ.get("RANK")
    return rank == "0" if rank is not None else not nproc
