"""Bench workers forked from one warm process instead of each started cold.

Every worker used to be a fresh `python -m ampkit.bench.worker JOB`: torch's import, torch._dynamo's
(every optimizer's constructor imports it) and ampkit's, then the run. On the project's slower CPU kind
(a 2-core AVX2 EPYC) those imports alone take ~4 s of every worker's start. Here one process, the
zygote (`python -m ampkit.bench.warm FD`, `bench/warm.py`), imports all of that once. It is started
with the first worker (fp32's, which forks from it once its imports are done: the same wait as a cold
start), and every later worker forks from it: a child starts with every import loaded, for the cost of
a fork (milliseconds). Measured on the AVX2 EPYC kind, the demo (`ampkit bench`, three precisions):
71 s against 85 s with every worker cold, the workers' start-up 3.2 s against 13.4 s.

A child is still a fresh worker in every way the measurement sees: the zygote runs no tensor op
(no allocator cache, no oneDNN primitive, no OpenMP thread pool to inherit), no CUDA (it is used for
CPU benches only: a process that initialised CUDA cannot fork a usable one, and torchrun's ranks are
started by torchrun), one Python thread. The child's stdout (progress events) and stderr (its log)
are the parent's pipe and log file, passed over a Unix socket (SCM_RIGHTS), as `subprocess.Popen`
would give them; its exit code comes back from the zygote, which reaps it. The parent ends the zygote
by closing the socket (also when the parent dies: the socket closes with it).

Protocol on the socket (one JSON object per message, newline-terminated): parent -> zygote
{"argv": [JOB]} with two fds (stdout's write end, the log); zygote -> parent {"ready": true} once its
imports are done, {"pid": N} after each fork, {"pid": N, "exit": CODE} when that child ends (a
negative code: killed by that signal, as `Popen.returncode`). One child at a time (the bench runs its
precisions one after another).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ampkit.bench.parallel import BenchParallel, worker_command

FORK_ENV = "AMPKIT_BENCH_FORK"
"""`AMPKIT_BENCH_FORK=0`: every worker started cold"""
READY_TIMEOUT_S = 300.0
"""hang protection only: how long a fork request waits for the zygote's imports"""


class ForkedWorker:
    """A worker forked by the zygote, with the part of `subprocess.Popen`'s interface the runner uses:
    `pid`, `stdout` (text, its progress events), `poll()`, `wait()`, `send_signal()`, `kill()`."""

    def __init__(self, zygote: Zygote, pid: int, stdout: IO[str]) -> None:
        self.zygote, self.pid, self.stdout = zygote, pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, block=False)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, block=True, timeout=timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"bench worker {self.pid}", timeout or 0.0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The parent's end: the warm process starts with the first worker asked of it (`start(argv, log)`),
    and every later worker forks from it. A context manager: leaving it ends the zygote. `log`: the
    zygote's own stderr (an import that fails says why there)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._ready = False
        self._exits: dict[int, int] = {}

    def _spawn(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs, open(self.log, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ampkit.bench.warm", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        self._sock = ours
        return ours

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The zygote ends once its socket closes (after the child it is waiting for, if any)."""
        if self._sock is not None:
            self._sock.close()
        if self.proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
            return
        self.proc.kill()
        self.proc.wait()

    def _message(self, timeout: float | None = None) -> dict[str, Any]:
        """The zygote's next message; {} when none came within `timeout` seconds (None: wait)."""
        assert self._sock is not None and self.proc is not None  # spawned
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if not ready:
                return {}
            data = self._sock.recv(65536)
            if not data:
                raise ZygoteGone(f"the bench's warm process ended (exit code {self.proc.wait()}; see {self.log})")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _read_until(self, key: str, timeout: float | None = None) -> dict[str, Any]:
        while True:
            message = self._message(timeout)
            if not message:
                return {}
            if "exit" in message:
                self._exits[message["pid"]] = message["exit"]
                if key == "exit":
                    return message
            elif key in message:
                return message

    def start(self, argv: list[str], log: IO[str]) -> ForkedWorker:
        """A worker running `python -m ampkit.bench.worker ARGV` as its own process would, forked from the
        warm process: stdout a pipe to the returned worker, stderr `log`."""
        sock = self._sock or self._spawn()
        if not self._ready:
            if not self._read_until("ready", timeout=READY_TIMEOUT_S):
                raise ZygoteGone(f"the bench's warm process was not ready after {READY_TIMEOUT_S:g} s")
            self._ready = True
        out_r, out_w = os.pipe()
        try:
            request = (json.dumps({"argv": argv}) + "\n").encode()
            socket.send_fds(sock, [request], [out_w, log.fileno()])
        except OSError as err:  # a broken pipe: it died
            os.close(out_r)
            raise ZygoteGone(f"the bench's warm process is gone ({err}; see {self.log})") from None
        finally:
            os.close(out_w)  # the child holds its copy: EOF on out_r when it ends
        pid = self._read_until("pid")["pid"]
        return ForkedWorker(self, pid, os.fdopen(out_r, "r", encoding="utf-8"))

    def exit_code(self, pid: int, *, block: bool, timeout: float | None = None) -> int | None:
        if pid not in self._exits:
            self._read_until("exit", timeout=timeout if block else 0.0)
        return self._exits.get(pid)


class ZygoteGone(RuntimeError):
    """The warm process died or never became ready."""


@contextlib.contextmanager
def warm_workers(*, device_type: str, distributed: bool, workers: Path) -> Iterator[Zygote | None]:
    """The warm process the workers fork from on a CPU; None (each worker started cold) for an accelerator
    (a forked process cannot use CUDA once its parent touched it) and for torchrun's ranks, or where
    `AMPKIT_BENCH_FORK=0`. It starts with the first worker asked of it (`Zygote.start`)."""
    if device_type != "cpu" or distributed or os.environ.get(FORK_ENV, "").strip() == "0":
        yield None
        return
    with Zygote(workers / "zygote.log") as zygote:
        yield zygote


def start_worker(
    job_path: Path, log: IO[str], parallel: BenchParallel, zygote: Zygote | None
) -> subprocess.Popen | ForkedWorker:
    """The worker for `job_path`: forked from `zygote`, or started cold where there is none or it cannot fork."""
    if zygote is not None:
        try:
            return zygote.start([str(job_path)], log)
        except (ZygoteGone, OSError) as err:  # a cold start instead: slower, the same result
            log.write(f"ampkit bench: the warm process could not fork this worker ({err}); starting it cold\n")
            log.flush()
    return subprocess.Popen(worker_command(job_path, parallel), stdout=subprocess.PIPE, stderr=log, text=True)
