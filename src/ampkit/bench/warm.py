"""The bench's warm process (`python -m ampkit.bench.warm FD`): imports what a worker needs once, then forks
one worker per request from the parent (`bench/zygote.py` has the protocol and the parent's end)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from typing import Any

from ampkit.bench import worker
from ampkit.shutdown import end_process


def _child(argv: list[str], out_fd: int, log_fd: int, sock: socket.socket) -> None:
    """In the forked child: become the worker (stdio, signals), run it, end as the worker process does."""
    # a stop that comes before the worker installs its handlers is recorded, as in a fresh worker
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: worker._EARLY_STOP.append(signum))
    worker.STARTED["how"] = "forked"
    sock.close()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(log_fd, 2)
    for fd in (devnull, out_fd, log_fd):
        os.close(fd)
    end_process(worker.main(argv))


def serve(fd: int) -> None:
    """The zygote: import what a worker needs, say ready, then fork one worker per request until the socket closes."""
    import torch._dynamo  # noqa: F401  (every optimizer's constructor imports it; the worker module does not)

    # a terminal's Ctrl-C reaches the whole process group: the running worker stops, the zygote ends
    # when the parent closes the socket
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)

    def say(message: dict[str, Any]) -> None:
        try:
            sock.sendall((json.dumps(message) + "\n").encode())
        except OSError:  # the parent went away: nothing is waiting for this process
            os._exit(0)

    say({"ready": True})
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 65536, 2)
        except OSError:
            return
        if not data:
            return  # the parent closed the socket
        request = json.loads(data.decode())
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request["argv"], fds[0], fds[1], sock)
        for descriptor in fds:
            os.close(descriptor)
        say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        say({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve(int(sys.argv[1]))
    os._exit(0)
