"""Run part of a plan's independent work in a forked copy of this process, beside the rest.

A transformers model's traced plan spends most of its CPU time in fake-tensor traces that do not
depend on one another (`plan/traced/steps.py`: one per shared setting and depth). A child
forked once the model is described starts with every import loaded (transformers' alone is ~2 s), so
on a second core the traces split in two for the cost of a fork (milliseconds) and of each process
filling its own fake-tensor cache. The child's results come back pickled through a pipe.

A second process pays only on an idle core: on this project's 2-core CPU with other jobs running (load
average 3.5-4), the 70B plan's answer came 0.1-0.3 s later with the child than without it (the two
processes shared one core, and each filled its own cache). So the child is forked only when a core
is idle now: fewer other runnable tasks than usable cores less one (/proc/loadavg's count of
runnable tasks, this process excluded, the least of a few readings 10 ms apart). The 1-minute load
average is no guide: it counts the last minute, so right after one plan (two busy processes) it
refused the next plan its second core on an otherwise idle machine.

Nothing depends on how a result was obtained: where forking is not offered (not Linux, one usable
core, no idle core unless `AMPKIT_PLAN_WORKERS=2`, `AMPKIT_PLAN_WORKERS=1`, threads running in this
process) or the child fails, dies or goes silent for `CHILD_TIMEOUT_S`, the caller gets no result for
those items and computes them itself.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

CHILD_TIMEOUT_S = 60.0
"""seconds the parent waits for the child once its own share is done (a deadlocked child only)"""
WORKERS_ENV = "AMPKIT_PLAN_WORKERS"
LOADAVG = "/proc/loadavg"
READINGS = 3
"""readings of the runnable count, 10 ms apart (their least: a task that runs for a moment is no load)"""


def other_runnable() -> int | None:
    """Runnable tasks now besides this process (/proc/loadavg's fourth field, "R/T": R counts this
    process too); None where that file cannot be read."""
    least = None
    for i in range(READINGS):
        try:
            with open(LOADAVG, encoding="ascii") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        least = running if least is None else min(least, running)
        if i + 1 < READINGS:
            time.sleep(0.01)
    return max(0, (least or 1) - 1)


def can_fork() -> bool:
    """Whether a second process may run beside this one (see the module docstring). `AMPKIT_PLAN_WORKERS`:
    1, never; 2, whatever the load; unset, when a core is idle."""
    workers = os.environ.get(WORKERS_ENV, "").strip()
    if sys.platform != "linux" or workers == "1":
        return False
    if threading.active_count() > 1:  # another Python thread may hold a lock the child would need
        return False
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        return False
    if workers == "2":
        return True
    others = other_runnable()
    return others is not None and others <= cores - 2  # this process and its child each get a core


def run_beside(child: Callable[[], Any], here: Callable[[], object], *, timeout_s: float = CHILD_TIMEOUT_S) -> Any:
    """`here()` in this process while `child()` runs in a forked copy; the child's (picklable) result,
    or None when there was no child or it did not deliver (the caller computes what is missing)."""
    if not can_fork():
        here()
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _serve(child, write_end)
    os.close(write_end)
    payload = None
    try:
        here()
        payload = _read_all(read_end, timeout_s)
    finally:
        os.close(read_end)
        _reap(pid, kill=payload is None)
    try:
        return pickle.loads(payload) if payload else None
    except (pickle.UnpicklingError, EOFError, ValueError):  # a child killed mid-write
        return None


def _serve(child: Callable[[], Any], write_end: int) -> None:
    code = 1
    try:
        data = pickle.dumps(child())
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view) :]
        code = 0
    except BaseException:
        pass
    finally:
        os._exit(code)  # no atexit handlers, no flush of the stdout buffer copied from the parent


def _read_all(fd: int, timeout_s: float) -> bytes | None:
    """Everything the child writes until it closes the pipe (None if it stays silent `timeout_s` seconds)."""
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reap(pid: int, *, kill: bool) -> None:
    """Wait for the child; `kill`: it may still be running (a timeout, an error or interrupt here)."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
