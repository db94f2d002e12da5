"""Graceful stop: SIGINT/SIGTERM are recorded, and the command ends at its next safe point.

`train` finishes the current step, writes a checkpoint, then ends the run; `bench` stops its worker
and writes the precisions it finished; `doctor` writes the parts it finished. Each then raises
`RunInterrupted` (exit 128 + the signal: 130 for SIGINT, 143 for SIGTERM).

A second signal of the same kind acts immediately (the previous handler), so a stuck run can still be
killed. Handlers are installed only from the main thread (Python's rule) and restored on exit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeAlias

from ampkit.errors import RunInterrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_Handler: TypeAlias = "Callable[[int, FrameType | None], Any] | int | signal.Handlers | None"
"""What `signal.signal` takes and returns (None: a handler not installed from Python)."""


class StopRequests:
    """`signum` is the first stop signal received (None until one arrives). `on_stop(signum)`, when
    given, runs inside the handler (keep it short: e.g. pass the signal on to a child process)."""

    def __init__(self, on_stop: Callable[[int], None] | None = None) -> None:
        self.signum: int | None = None
        self.on_stop = on_stop
        self._previous: dict[int, _Handler] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))  # the next one is not graceful
        if self.on_stop is not None:
            self.on_stop(signum)

    @property
    def name(self) -> str | None:
        """ "SIGINT", "SIGTERM", or None before any signal."""
        return signal.Signals(self.signum).name if self.signum is not None else None

    def check(self, message: str = "stopped") -> None:
        """At a safe point: raise `RunInterrupted(message)` when a stop was requested."""
        if self.signum is not None:
            raise RunInterrupted(f"{message} by {self.name}", signum=self.signum)

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
