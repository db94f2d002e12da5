"""`python -m ampkit ARGV` for the tests, forked from one warm process per pytest worker instead of started cold.

The suite starts ~100 `python -m ampkit ...` processes (and the launchers of ~30 two-rank jobs). Each paid
the same start-up: Python, torch, torch._dynamo (every optimizer's constructor imports it), transformers
and ampkit's own modules, ~4-5 CPU s a process on the project's 2-core AVX2 EPYC kind. Here one process
per pytest worker (`python tests/warm_ampkit.py FD`, started with the first command) imports all of that
once, and each command forks from it: the child is `python -m ampkit ARGV` in every way the test sees --
its own pid, cwd, environment, stdin/stdout/stderr pipes, exit code (negative: killed by that signal),
file-size limit, `sys.argv` and `sys.path[0]` as `-m` sets them, default signal handlers -- with the
imports already done. Like `ampkit.bench.warm` (the bench's own warm process, whose rules this follows),
the warm process runs no tensor op and starts no thread, so a child inherits no OpenMP pool, allocator
cache or lock held by another thread.

`ampkit_process` (tests/helpers.py) and the distributed tests' `launch.ampkit` use it, and start the
command cold when it cannot be the same: an environment that differs from the warm process's (the first
command's) in anything read at start-up (`READ_AT_START`: PYTHONPATH's sitecustomize, ATEN_CPU_CAPABILITY,
OMP_NUM_THREADS, HF_* and the like are read before or at import), other Popen
arguments, `AMPKIT_TEST_COLD=1` (the whole suite cold, e.g. to compare), or a warm process that died.
Tests that measure a process's own start-up or imports (tests/bench/test_startup.py, ...) start theirs
cold with `subprocess` themselves.

Protocol (one JSON object per line on a Unix socketpair): test -> warm {"argv", "env", "cwd", "fsize"}
with three fds (the child's stdin, stdout, stderr); warm -> test {"ready": true} once imported,
{"pid": N} after each fork, {"pid": N, "exit": CODE} when that child ends. Children may overlap.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

COLD_ENV = "AMPKIT_TEST_COLD"
LOG_ENV = "AMPKIT_TEST_WARM_LOG"  # a file: one line per command started cold, and why
READY_TIMEOUT_S = 300.0  # hang protection only: the warm process's imports take ~10 s on the slow kind
READ_AT_START = (
    "PYTHON",  # PYTHONPATH (the distributed tests' sitecustomize), PYTHONWARNINGS, PYTHONHASHSEED, ...
    "LD_",
    "OMP_",  # OpenMP reads its thread count when torch loads it
    "MKL_",
    "KMP_",
    "GOMP_",
    "ATEN_CPU_CAPABILITY",  # the kernels torch dispatches to, chosen at load
    "ONEDNN_",
    "DNNL_",
    "TORCH_LOGS",
    "PYTORCH_JIT",
    "HF_",  # huggingface_hub's and transformers' folders and modes, read at their import
    "TRANSFORMERS_",
    "HUGGINGFACE_",
    "XDG_",
    "HOME",
    "MPLCONFIGDIR",
)
"""Variables (prefixes) read at a process's start or at an import the warm process has done: a command whose
environment differs from the warm process's in one of these starts cold. The rest are read when used (ampkit
reads none at import); the tests' process gains some as it goes (torch, tokenizers and mlflow set their own),
which its commands inherit either way."""


# ----------------------------------------------------------------------------------------------- the warm side


def _preload() -> None:
    """What a train, bench, plan or doctor command imports before its first line of work."""
    import torch
    import torch._dynamo
    import torch.distributed.run  # noqa: F401  (`--nproc N`: the launcher runs torchrun's agent in-process)

    from ampkit.cli import bench, doctor, plan, train  # noqa: F401
    from ampkit.train import build  # noqa: F401


def _child(request: dict[str, Any], fds: list[int], sock: socket.socket, others: list[int]) -> None:
    """In the forked child: become `python -m ampkit ARGV` as a fresh process would be, run it, exit."""
    code = 1
    try:
        sock.close()
        for fd in others:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        if request.get("fsize"):  # as tests/helpers.py's limit_file_size: EFBIG, as on a full quota
            import resource

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (request["fsize"], request["fsize"]))
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR is read again, as in a fresh process
        import runpy

        import ampkit

        sys.argv = [str(Path(ampkit.__file__).with_name("__main__.py")), *request["argv"]]
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        try:
            runpy.run_module("ampkit", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:  # as the interpreter ends on an uncaught exception
            sys.excepthook(*sys.exc_info())
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed pipe: nothing more to say
                pass
        os._exit(code)


def serve(fd: int) -> None:
    """Import, say ready, then fork one child per request (children may overlap) until the socket closes."""
    _preload()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the group stops the children, not this
    sock = socket.socket(fileno=fd)
    children: dict[int, int] = {}  # pidfd -> pid

    def say(message: dict[str, Any]) -> None:
        try:
            sock.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            os._exit(0)  # the tests went away

    if threading.active_count() != 1:  # a thread at fork time could hold a lock the child then needs
        say({"ready": False, "why": f"{threading.active_count()} threads after the imports"})
        return
    say({"ready": True})
    while True:
        readable, _, _ = select.select([sock, *children], [], [])
        for pidfd in [r for r in readable if r in children]:
            pid = children.pop(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            say({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except OSError:
            return
        if not data:
            return  # the tests closed the socket
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(json.loads(data.decode()), fds, sock, list(children))
        for descriptor in fds:
            os.close(descriptor)
        children[os.pidfd_open(pid)] = pid
        say({"pid": pid})


# ----------------------------------------------------------------------------------------------- the tests' side


class WarmGone(RuntimeError):
    """The warm process died or never became ready: the command starts cold instead."""


class WarmAmpkit:
    """One warm process (started at the first `run`) and the children it forks for this pytest worker."""

    def __init__(self) -> None:
        self.env: dict[str, str] | None = None  # the warm process's: the first command's
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.broken = os.environ.get(COLD_ENV) == "1"
        self._buffer = b""
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()

    def can_run(self, env: dict[str, str]) -> bool:
        """Whether a child of the warm process would start as a cold `python -m ampkit` with `env` would."""
        if self.broken:
            return False
        if self.env is None:
            self.env = dict(env)
        return not self.start_differs(env)

    def start_differs(self, env: dict[str, str]) -> list[str]:
        """The variables read at start-up in which `env` differs from the warm process's."""
        base = self.env or env
        keys = {key for key in set(env) | set(base) if env.get(key) != base.get(key)}
        return sorted(key for key in keys if key.startswith(READ_AT_START))

    def note_cold(self, argv, env: dict[str, str]) -> None:
        """With `AMPKIT_TEST_WARM_LOG=FILE`: why this command started cold, one line (what still pays a start-up)."""
        log = os.environ.get(LOG_ENV)
        if log:
            differ = self.start_differs(env)
            why = "warm process gone or off" if self.broken else f"environment differs in {differ}"
            with open(log, "a", encoding="utf-8") as file:
                file.write(f"cold {os.getpid()} {' '.join(map(str, argv))[:120]}: {why}\n")

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        self.sock = ours
        ready = self._read(lambda m: "ready" in m, timeout=READY_TIMEOUT_S)
        if not ready.get("ready"):
            raise WarmGone(f"the warm process is not usable: {ready.get('why', 'no answer')}")

    def _read(self, want, timeout: float | None) -> dict[str, Any]:
        """The next message `want` accepts ({} when none within `timeout`); exits are kept as they come."""
        assert self.sock is not None and self.proc is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if "exit" in message:
                    self._exits[message["pid"]] = message["exit"]
                if want(message):
                    return message
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], left)[0]:
                return {}
            data = self.sock.recv(65536)
            if not data:
                raise WarmGone(f"the warm process ended (exit code {self.proc.wait()})")
            self._buffer += data

    def _fork(self, argv: list[str], env: dict[str, str], cwd: str, fsize: int | None, fds: list[int]) -> int:
        with self._lock:
            if self.proc is None:
                self._start()
            assert self.sock is not None
            request = {"argv": argv, "env": env, "cwd": cwd, "fsize": fsize}
            try:
                socket.send_fds(self.sock, [(json.dumps(request) + "\n").encode()], fds)
            except OSError as err:
                raise WarmGone(f"the warm process is gone ({err})") from None
            return self._read(lambda m: "pid" in m and "exit" not in m, timeout=READY_TIMEOUT_S)["pid"]

    def _exit_code(self, pid: int, timeout: float) -> int | None:
        with self._lock:
            if pid not in self._exits:
                self._read(lambda m: m.get("pid") == pid and "exit" in m, timeout=timeout)
            return self._exits.pop(pid, None)

    def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str | os.PathLike | None,
        timeout: float,
        fsize: int | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """As `subprocess.run([python, -m, ampkit, *argv], capture_output=True, text=True, ...)`."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = self._fork(argv, env, os.fspath(cwd or os.getcwd()), fsize, [in_r, out_w, err_w])
        except WarmGone:
            self.broken = True
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w):  # the child's ends: it holds its own copies
                os.close(fd)
        command = [sys.executable, "-m", "ampkit", *argv]
        if os.environ.get(LOG_ENV):
            with open(os.environ[LOG_ENV], "a", encoding="utf-8") as file:
                file.write(f"warm {os.getpid()} {' '.join(argv)[:120]}\n")
        feeder = threading.Thread(target=_feed, args=(in_w, input or ""), daemon=True)
        feeder.start()
        out, err, timed_out = _drain(out_r, err_r, deadline=time.monotonic() + timeout)
        code = None if timed_out else self._exit_code(pid, timeout=max(1.0, timeout))
        if code is None:
            os.kill(pid, signal.SIGKILL)
            self._exit_code(pid, timeout=30)
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(command, code, out, err)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _feed(fd: int, text: str) -> None:
    try:
        if text:
            os.write(fd, text.encode())
    except OSError:
        pass  # the child never read it (or closed stdin), as with Popen.communicate
    finally:
        os.close(fd)


def _drain(out_fd: int, err_fd: int, *, deadline: float) -> tuple[str, str, bool]:
    """Both pipes read to EOF (the child and anything it started closed them), or the deadline passed."""
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    open_fds = [out_fd, err_fd]
    timed_out = False
    while open_fds:
        left = deadline - time.monotonic()
        readable = select.select(open_fds, [], [], max(0.0, left))[0] if left > 0 else []
        if not readable:
            timed_out = True
            break
        for fd in readable:
            data = os.read(fd, 65536)
            if data:
                chunks[fd].append(data)
            else:
                open_fds.remove(fd)
    for fd in (out_fd, err_fd):
        os.close(fd)
    # as text=True reads them: universal newlines (a progress bar's "\r" becomes "\n")
    text = [
        b"".join(chunks[fd]).decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        for fd in (out_fd, err_fd)
    ]
    return text[0], text[1], timed_out


if __name__ == "__main__":
    serve(int(sys.argv[1]))
    os._exit(0)
