"""The one exception type for user mistakes.

A `UsageError` is something the user can fix (bad flag, missing file, unsupported precision on
this device). The CLI prints its message on one line and exits with code 2, no traceback.
Messages name the problem *and* the fix.
"""

import errno as _errno
import os


class UsageError(Exception):
    """A user-fixable problem; the message names the problem and the fix."""


class TrainingError(Exception):
    """A run that cannot continue (e.g. the loss scale collapsed below its floor)."""


class RunDiverged(TrainingError):
    """The loss went non-finite (or the loss scale collapsed) and no NaN guard was on: the run ends
    without writing the non-finite state; the message names the step and the next command."""


class RunInterrupted(TrainingError):
    """SIGINT/SIGTERM stopped a run gracefully (after a checkpoint); the exit code is 128 + signal."""

    def __init__(self, message: str, *, signum: int):
        super().__init__(message)
        self.signum = signum


class WriteFailed(TrainingError):
    """A file could not be written (disk full, quota, file too large, read-only, I/O error).

    The partial or temporary file is already removed when this is raised; `path` is the file that
    was meant to be written, `reason` the cause in words and errno name, e.g. "No space left on
    device (ENOSPC)". The CLI prints the message on one line and exits with code 1."""

    def __init__(self, path, reason: str, *, errno_code: int | None = None, message: str | None = None):
        super().__init__(message or f"cannot write {path}: {reason}")
        self.path = str(path)
        self.reason = reason
        self.errno_code = errno_code


class CheckpointWriteFailed(WriteFailed):
    """A checkpoint (single-file or sharded) could not be written (disk full, read-only directory); the
    previous one stays."""

    def __init__(self, path, reason: str | None = None, **kwargs):
        if reason is None:  # CheckpointWriteFailed("message"), as callers wrote it before it was a WriteFailed
            super().__init__("", "", message=str(path))
        else:
            super().__init__(path, reason, **kwargs)


# How torch's zip writer reports a failed write: a RuntimeError, chained from the OSError when
# it writes to a Python file object, bare ("iostream error") when it writes to a path itself.
_TORCH_WRITER_MARKERS = ("inline_container", "PytorchStreamWriter", "iostream error", "unexpected pos")


def exception_chain(exc: BaseException | None) -> list[BaseException]:
    """`exc`, then what it was raised from or while handling, and so on (each once)."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def errno_reason(code: int | None, fallback: str = "") -> str:
    """'No space left on device (ENOSPC)' for errno.ENOSPC; `fallback` when there is no errno."""
    if not code:
        return fallback or "write error"
    return f"{os.strerror(code)} ({_errno.errorcode.get(code, f'errno {code}')})"


def write_error_reason(exc: BaseException) -> tuple[str, int | None] | None:
    """(reason, errno) when `exc` is a failure to write a file, else None.

    A failure to write is an OSError of any errno, or torch's zip-writer RuntimeError, anywhere
    in the chain of a RuntimeError (an OSError found there names the cause)."""
    if not isinstance(exc, (OSError, RuntimeError)):  # e.g. a TypeError while serializing: a bug, not the disk
        return None
    chain = exception_chain(exc)
    for err in chain:
        if isinstance(err, OSError):
            return errno_reason(err.errno, err.strerror or str(err) or type(err).__name__), err.errno
    for err in chain:
        first = (str(err).strip().splitlines() or [""])[0]
        if isinstance(err, RuntimeError) and any(m in first for m in _TORCH_WRITER_MARKERS):
            return f"torch's archive writer failed ({first[:160]})", None
    return None


def as_write_failed(path, exc: BaseException) -> WriteFailed | None:
    """`exc` as a WriteFailed for `path` when it is a failure to write (see `write_error_reason`)."""
    if isinstance(exc, WriteFailed):
        return exc
    found = write_error_reason(exc)
    if found is None:
        return None
    reason, code = found
    return WriteFailed(path, reason, errno_code=code)
