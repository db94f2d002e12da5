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

A bench's own warm process (`ampkit.bench.zygote.Zygote`, `python -m ampkit.bench.warm FD`) forks from here too:
`warm_bench_spawn` replaces its cold start in the pytest process (tests/conftest.py) and in every forked command.
torchrun's ranks do through `tests/warm_python`, their `PYTHON_EXEC`.

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
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

COLD_ENV = "AMPKIT_TEST_COLD"
SOCKET_ENV = "AMPKIT_TEST_WARM_SOCKET"  # where the warm process listens (tests/warm_python connects there)
PYTHON_ENV = "AMPKIT_TEST_WARM_PYTHON"  # the interpreter tests/warm_python runs instead where it cannot fork
RANK_CLIENT = Path(__file__).with_name("warm_python")
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


def _watch(pid: int) -> None:
    """A rank's client (the process torchrun started and signals) died, even by SIGKILL: so does the rank."""
    import threading

    def wait() -> None:
        try:
            select.select([os.pidfd_open(pid)], [], [])
        except ProcessLookupError:  # already gone
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, daemon=True, name="warm-watch").start()


def _python(args: list[str]) -> None:
    """Run `python ARGS` (`[-u] -m MODULE ...` or `[-u] SCRIPT ...`) in this process, as the interpreter would."""
    import runpy

    while args and args[0] == "-u":  # unbuffered, as torchrun starts its ranks
        args = args[1:]
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    if args[0] == "-m":
        sys.argv = ["-m", *args[2:]]  # argv[0] becomes the module's file in run_module, as with `python -m`
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


def _child(request: dict[str, Any], fds: list[int], close: list[int]) -> None:
    """In the forked child: become `python ARGS` as a fresh process would be, run it, exit."""
    code = 1
    try:
        for fd in close:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        if request.get("session"):
            os.setsid()  # as torchrun's ranks (start_new_session)
        if request.get("watch"):
            _watch(request["watch"])
        if request.get("fsize"):  # as tests/helpers.py's limit_file_size: EFBIG, as on a full quota
            import resource

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (request["fsize"], request["fsize"]))
        targets = request.get("targets") or list(range(len(fds)))  # the fd numbers the child sees them as
        moved = [os.dup(fd) for fd in fds]  # out of the way of the targets first
        for fd in fds:
            os.close(fd)
        for target, fd in zip(targets, moved, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        if request.get("bench_from"):  # a bench this command runs: its warm process forks from here too
            warm_bench_spawn(request["bench_from"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR is read again, as in a fresh process
        try:
            _python(request["python_args"])
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


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass  # the client went away (its child, if any, watches it or is reaped all the same)


def serve(control_fd: int, path: str) -> None:
    """Import, say ready on the control socket, then fork one child per connection on `path` (children overlap),
    until the control socket closes (the tests' process ended)."""
    _preload()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the group stops the children, not this
    base_env = dict(os.environ)
    control = socket.socket(fileno=control_fd)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    waiting: list[socket.socket] = []  # connected, request not read yet
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its client's connection)
    if threading.active_count() != 1:  # a thread at fork time could hold a lock the child then needs
        control.sendall(json.dumps({"ready": False, "why": f"{threading.active_count()} threads"}).encode() + b"\n")
        return
    control.sendall(b'{"ready": true}\n')
    while True:
        readable = select.select([control, listener, *waiting, *children], [], [])[0]
        if control in readable and not control.recv(1):
            os.unlink(path)
            return
        if listener in readable:
            waiting.append(listener.accept()[0])
        for pidfd in [r for r in readable if isinstance(r, int)]:
            pid, conn = children.pop(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            conn.close()
        for conn in [r for r in readable if r in waiting]:
            waiting.remove(conn)
            try:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
                request = json.loads(data)
            except (OSError, ValueError):
                conn.close()
                continue
            if _starts_differently(request["env"], base_env):
                _send(conn, {"cold": True})
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                keep = set(fds)
                close = [control.fileno(), listener.fileno(), *(c.fileno() for c in waiting), *children]
                close += [c.fileno() for _, c in children.values()] + [conn.fileno()]
                _child(request, fds, [fd for fd in close if fd not in keep])
            for fd in fds:
                os.close(fd)
            children[os.pidfd_open(pid)] = (pid, conn)
            _send(conn, {"pid": pid})


def start(path: str, python_args: list[str], *, fds: list[int], targets: list[int], env: dict[str, str], cwd: str):
    """`python ARGS` forked from the warm process at `path`, with `fds` as the child's `targets`; a `ForkedProcess`
    (raises WarmGone where it cannot: no warm process, or it declined)."""
    import resource

    request = {"python_args": python_args, "env": env, "cwd": cwd, "targets": targets, "bench_from": path}
    fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[0]  # a process started cold would inherit it
    if fsize != resource.RLIM_INFINITY:
        request["fsize"] = fsize
    return ForkedProcess(*_fork_at(path, request, fds))


def _fork_at(path: str, request: dict[str, Any], fds: list[int]) -> tuple[socket.socket, int]:
    """Ask the warm process at `path` for a child: the connection its exit code will come on, and its pid."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode()], fds)
        reply = json.loads(conn.recv(65536) or b"{}")
    except (OSError, ValueError) as err:
        conn.close()
        raise WarmGone(f"the warm process is gone ({err})") from None
    if "pid" not in reply:
        conn.close()
        raise WarmGone(f"the warm process declined: {reply}")
    return conn, reply["pid"]


class ForkedProcess:
    """A child of the warm process with the part of `subprocess.Popen` that `ampkit.bench.zygote.Zygote` uses."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid = conn, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode if self.returncode is not None else self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self.returncode if self.returncode is not None else self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"warm child {self.pid}", timeout or 0.0)
        return code

    def _read(self, timeout: float | None) -> int | None:
        if select.select([self.conn], [], [], timeout)[0]:
            data = self.conn.recv(65536)
            self.returncode = json.loads(data)["exit"] if data else -signal.SIGKILL
            self.conn.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


def warm_bench_spawn(path: str) -> None:
    """From now on in this process, a bench's warm process (`ampkit.bench.warm`) is forked from the tests' warm
    process at `path` instead of started cold (`Zygote._spawn`); cold where that process is gone or declines."""
    from ampkit.bench import zygote

    cold_spawn = zygote.Zygote._spawn

    def spawn(self: zygote.Zygote) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with theirs, open(self.log, "w", encoding="utf-8") as log, open(os.devnull) as devnull:
                fds = [devnull.fileno(), log.fileno(), log.fileno(), theirs.fileno()]
                args = ["-m", "ampkit.bench.warm", "3"]
                self.proc = start(path, args, fds=fds, targets=[0, 1, 2, 3], env=dict(os.environ), cwd=os.getcwd())
        except WarmGone:
            ours.close()
            return cold_spawn(self)
        self._sock = ours
        return ours

    zygote.Zygote._spawn = spawn  # type: ignore[method-assign]


def _starts_differently(env: dict[str, str], base: dict[str, str]) -> list[str]:
    """The variables read at start-up in which `env` differs from `base` (the warm process's)."""
    keys = {key for key in set(env) | set(base) if env.get(key) != base.get(key)}
    return sorted(key for key in keys if key.startswith(READ_AT_START) and key != "PYTHON_EXEC")


# ----------------------------------------------------------------------------------------------- the tests' side


class WarmGone(RuntimeError):
    """The warm process died, never became ready, or declined: the command starts cold instead."""


class WarmAmpkit:
    """One warm process (started at the first `run`, with that command's environment) and the children it
    forks for this pytest worker; `rank_env()` makes torchrun fork its ranks from it too (`tests/warm_python`)."""

    def __init__(self) -> None:
        self.env: dict[str, str] | None = None  # the warm process's: the first command's
        self.proc: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.path = ""
        self.broken = os.environ.get(COLD_ENV) == "1"
        self._lock = threading.Lock()

    def rank_env(self) -> dict[str, str]:
        """What a command's environment gains so that torchrun's ranks (its `PYTHON_EXEC`) fork from here."""
        if self.broken:
            return {}
        if not self.path:
            folder = tempfile.mkdtemp(prefix="ampkit-warm-")
            self.path = os.path.join(folder, "socket")
        return {"PYTHON_EXEC": str(RANK_CLIENT), SOCKET_ENV: self.path, PYTHON_ENV: sys.executable}

    def can_run(self, env: dict[str, str]) -> bool:
        """Whether a child of the warm process would start as a cold `python -m ampkit` with `env` would."""
        if self.broken:
            return False
        if self.env is None:
            self.env = dict(env)
        return not _starts_differently(env, self.env)

    def started(self, env: dict[str, str]) -> str | None:
        """The warm process's socket, started now if it can be (with `env`, as a first command's): None where not."""
        env = {**env, **self.rank_env()}
        if not self.can_run(env):
            return None
        try:
            with self._lock:
                if self.proc is None:
                    self._start()
        except WarmGone:
            self.broken = True
            return None
        return self.path

    def note_cold(self, argv, env: dict[str, str]) -> None:
        """With `AMPKIT_TEST_WARM_LOG=FILE`: why this command started cold, one line (what still pays a start-up)."""
        log = os.environ.get(LOG_ENV)
        if log:
            differ = _starts_differently(env, self.env or env)
            why = "warm process gone or off" if self.broken else f"environment differs in {differ}"
            with open(log, "a", encoding="utf-8") as file:
                file.write(f"cold {os.getpid()} {' '.join(map(str, argv))[:120]}: {why}\n")

    def _start(self) -> None:
        assert self.env is not None and self.path
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(theirs.fileno()), self.path],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        self.control = ours
        ready = b""
        while not ready.endswith(b"\n"):
            if not select.select([ours], [], [], READY_TIMEOUT_S)[0]:
                raise WarmGone(f"the warm process was not ready after {READY_TIMEOUT_S:g} s")
            data = ours.recv(4096)
            if not data:
                raise WarmGone(f"the warm process ended (exit code {self.proc.wait()})")
            ready += data
        message = json.loads(ready)
        if not message.get("ready"):
            raise WarmGone(f"the warm process is not usable: {message.get('why')}")

    def _fork(self, request: dict[str, Any], fds: list[int]) -> tuple[socket.socket, int]:
        with self._lock:
            if self.proc is None:
                self.rank_env()
                self._start()
        return _fork_at(self.path, request, fds)

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
        request = {"python_args": ["-m", "ampkit", *argv], "env": env, "cwd": os.fspath(cwd or os.getcwd())}
        request["bench_from"] = self.path
        try:
            conn, pid = self._fork({**request, "fsize": fsize}, [in_r, out_w, err_w])
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
        deadline = time.monotonic() + timeout
        with conn:
            out, err, timed_out = _drain(out_r, err_r, deadline=deadline)
            code = None if timed_out else _exit_code(conn, deadline)
            if code is None:
                os.kill(pid, signal.SIGKILL)
                _exit_code(conn, time.monotonic() + 30)
                raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(command, code, out, err)

    def close(self) -> None:
        if self.control is not None:
            self.control.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _exit_code(conn: socket.socket, deadline: float) -> int | None:
    """The child's exit code from its connection (None: not within the deadline)."""
    if not select.select([conn], [], [], max(0.0, deadline - time.monotonic()))[0]:
        return None
    data = conn.recv(65536)
    return json.loads(data)["exit"] if data else None


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
    serve(int(sys.argv[1]), sys.argv[2])
    os._exit(0)
