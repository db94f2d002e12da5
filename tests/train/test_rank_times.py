"""ampkit.train.rank_times: each rank's step-time median and p90, its straggler score, and the
report's Ranks table."""

from __future__ import annotations

import pytest

from ampkit.core.parallel import LocalRun
from ampkit.summaries import KINDS
from ampkit.train.rank_times import gather_rank_times, own_step_times, percentile, straggler_scores
from ampkit.train.report import rank_rows


def test_nearest_rank_p90():
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 0.9) == 9.0
    assert percentile([5.0], 0.9) == 5.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_own_times_in_ms_and_scores_against_the_fastest_median():
    fast = own_step_times([0.010, 0.012, 0.011, 0.030])
    slow = own_step_times([0.015, 0.0165, 0.0135, 0.020])
    assert fast["step_ms_median"] == pytest.approx(11.5) and fast["step_ms_p90"] == pytest.approx(30.0)
    assert fast["windows"] == 4
    ranks = straggler_scores([slow, fast])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[1]["straggler"] == 1.0
    assert ranks[0]["straggler"] == pytest.approx(ranks[0]["step_ms_median"] / fast["step_ms_median"])
    assert rank_rows(ranks)[1] == ["1", "11.5", "30.0", "1.00", "4"]


def test_a_rank_without_measured_steps_has_no_score():
    ranks = straggler_scores([own_step_times([]), own_step_times([0.02])])
    assert ranks[0]["straggler"] is None and ranks[1]["straggler"] == 1.0
    assert rank_rows(ranks)[0][1:4] == ["-", "-", "-"]


def test_one_process_gathers_nothing():
    assert gather_rank_times(LocalRun(), [0.01, 0.02], agreed=True) is None


def test_the_train_summary_kind_takes_the_ranks_block():
    kind = next(k for k in KINDS if k.name == "train")
    spec = kind.fields["ranks"].spec.spec.spec  # Absent(Opt(ListOf(RANK_TIMES)))
    assert set(spec) == set(straggler_scores([own_step_times([0.01])])[0])
