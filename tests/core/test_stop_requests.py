"""ampkit.core.signals: the first SIGINT/SIGTERM asks for a graceful stop, the second acts at once."""

from __future__ import annotations

import signal
import threading

import pytest

from ampkit.core.signals import STOP_SIGNALS, StopRequests


@pytest.fixture
def previous_handler():
    """A recording handler in place of SIGTERM's default (which would end the test process)."""
    seen: list[int] = []
    original = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGTERM, original)


def test_first_signal_is_recorded_and_the_second_goes_to_the_previous_handler(previous_handler):
    before = signal.getsignal(signal.SIGTERM)
    with StopRequests() as stop:
        assert stop.signum is None
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM and previous_handler == []
        signal.raise_signal(signal.SIGTERM)  # not graceful any more
        assert previous_handler == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before  # restored on exit


def test_outside_the_main_thread_no_handler_is_installed():
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    during = {}

    def run():
        with StopRequests():
            during.update({s: signal.getsignal(s) for s in STOP_SIGNALS})

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert during == before
