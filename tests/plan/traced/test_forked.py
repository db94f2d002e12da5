"""plan/traced/forked.py runs part of the work in a forked child, and the traced engine's prefetch through it
gives the tables a sequential plan traces; any failure of the child leaves the work to the caller."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from ampkit.plan.describe import describe_model
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced import forked
from ampkit.plan.traced.extrapolate import HFTracedEngine
from hf_archs import save_tiny


@pytest.fixture
def forking(monkeypatch):
    """A child forked whatever the load (the suite may run on a busy machine, where it is not by
    default); skipped where forking is not offered at all (not Linux, one core, threads running)."""
    monkeypatch.setenv(forked.WORKERS_ENV, "2")
    if not forked.can_fork():
        pytest.skip("forking is not offered here (see plan/traced/forked.py)")


def test_the_child_computes_beside_this_process(forking):
    ran = []
    got = forked.run_beside(lambda: {"pid": os.getpid(), "value": 42}, lambda: ran.append(os.getpid()))
    assert ran == [os.getpid()]
    assert got["value"] == 42 and got["pid"] != os.getpid()


def test_a_failing_child_delivers_nothing(forking):
    def child():
        raise RuntimeError("boom")

    ran = []
    assert forked.run_beside(child, lambda: ran.append(1)) is None
    assert ran == [1]


def test_a_silent_child_is_killed_after_the_timeout(forking):
    import time

    assert forked.run_beside(lambda: time.sleep(30), lambda: None, timeout_s=0.5) is None


def test_workers_1_runs_everything_here(monkeypatch):
    monkeypatch.setenv(forked.WORKERS_ENV, "1")
    assert not forked.can_fork()
    ran = []
    assert forked.run_beside(lambda: 1, lambda: ran.append(1)) is None
    assert ran == [1]


def _loadavg(tmp_path, monkeypatch, text: str) -> None:
    """/proc/loadavg's text, as a file of that form the module reads instead."""
    path = tmp_path / "loadavg"
    path.write_text(text)
    monkeypatch.setattr(forked, "LOADAVG", str(path))
    monkeypatch.delenv(forked.WORKERS_ENV, raising=False)


def test_no_idle_core_runs_everything_here(tmp_path, monkeypatch):
    _loadavg(tmp_path, monkeypatch, "0.10 0.20 0.30 99/300 4242\n")
    assert not forked.can_fork()


def test_an_idle_core_now_forks_whatever_the_last_minute_was(tmp_path, monkeypatch):
    """Right after another plan the 1-minute average is high on an idle machine: the count of tasks
    runnable now (this process alone) decides."""
    if sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2 or threading.active_count() > 1:
        pytest.skip("forking is not offered here (see plan/traced/forked.py)")
    _loadavg(tmp_path, monkeypatch, "3.50 1.20 0.40 1/300 4242\n")
    assert forked.other_runnable() == 0
    assert forked.can_fork()


def test_an_unreadable_loadavg_runs_everything_here(tmp_path, monkeypatch):
    _loadavg(tmp_path, monkeypatch, "garbage")
    assert forked.other_runnable() is None and not forked.can_fork()


def test_prefetched_tables_equal_the_sequential_ones(tmp_path, monkeypatch, forking):
    pytest.importorskip("transformers")
    save_tiny(tmp_path, "llama", layers=8)
    desc = describe_model(f"hf:{tmp_path}")
    settings = [
        StepSetting(precision=p, checkpointing=c, micro_batch=1, seq_len=32)
        for p in ("fp32", "fp16-mixed", "bf16-mixed", "bf16-true")
        for c in ("none", "full")
    ]
    parallel = HFTracedEngine(desc)
    parallel.prefetch(settings, capacity=1 << 50)  # every fit searched
    here = parallel.steps.traced
    assert 0 < here < len(parallel.steps._memo)  # the child traced the others
    monkeypatch.setenv(forked.WORKERS_ENV, "1")
    sequential = HFTracedEngine(desc)
    capacity = 2 * sequential.ledger(settings[0]).total
    for setting in settings:
        ledger = parallel.ledger(setting)
        assert ledger == sequential.ledger(setting), setting.label()
        assert parallel.fit(setting, ledger.total, capacity) == sequential.fit(setting, ledger.total, capacity)
    assert parallel.steps.traced == here  # every row's and fit's step was prefetched
    assert parallel.note == sequential.note


def test_a_sequence_past_the_positions_is_refused_before_any_trace(tmp_path):
    pytest.importorskip("transformers")
    from ampkit.errors import UsageError

    save_tiny(tmp_path, "gpt2", layers=8, max_position_embeddings=64)
    desc = describe_model(f"hf:{tmp_path}")
    engine = HFTracedEngine(desc)
    settings = [StepSetting(precision=p, seq_len=128) for p in ("fp32", "bf16-mixed")]
    engine.prefetch(settings)  # leaves the refusal to the ledger
    assert engine._tables == {}
    with pytest.raises(UsageError, match="exceeds"):
        engine.ledger(settings[0])
