"""ampkit.plan.analytic.replay: the symbolic allocator the analytic ledger replays a step on."""

from __future__ import annotations

import pytest

from ampkit.plan.analytic.replay import Replay


def test_peak_and_its_breakdown_are_kept_when_memory_is_freed():
    r = Replay(record_totals=True)
    r.moment = "forward"
    r.alloc("w", "parameters", 100)
    r.alloc("act", "activations", 50.7)  # whole bytes
    r.moment = "backward"
    r.free("act", "not-live")  # a name that is not live is ignored
    r.alloc("g", "gradients", 30)
    assert (r.peak, r.total, r.totals) == (150, 130, [100, 150, 130])
    assert r.peak_moment == "forward"
    assert {line: n for line, n in r.peak_lines.items() if n} == {"parameters": 100, "activations": 50}
    assert r.moment_peaks == {"forward": 150, "backward": 130}
    assert r.largest["activations"] == 50 and r.current["activations"] == 0


def test_move_refiles_a_live_allocation_and_rename_keeps_it_live():
    r = Replay()
    r.alloc("tmp.g", "temporaries", 8)
    r.move("tmp.g", "gradients")
    r.rename("tmp.g", "p.grad")
    assert (r.current["temporaries"], r.current["gradients"]) == (0, 8)
    assert r.is_live("p.grad") and not r.is_live("tmp.g")
    assert r.totals is None  # not recorded unless asked


def test_free_prefix_and_double_allocation():
    r = Replay()
    for name in ("b0.x", "b0.y", "b1.x"):
        r.alloc(name, "activations", 1)
    r.free_prefix("b0.")
    assert r.total == 1 and r.is_live("b1.x")
    with pytest.raises(KeyError, match="allocated twice"):
        r.alloc("b1.x", "activations", 1)
