"""Graceful stop: SIGINT/SIGTERM finish the current step, write a checkpoint, then end the run.

A second signal of the same kind acts immediately (default handler), so a stuck run can still be
killed. Handlers are installed only from the main thread (Python's rule) and restored on exit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeAlias

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_Handler: TypeAlias = "Callable[[int, FrameType | None], Any] | int | signal.Handlers | None"
"""What `signal.signal` takes and returns (None: a handler not installed from Python)."""


class StopRequests:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, _Handler] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))  # the next one is not graceful

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
