"""The sequence model's lengths and algebra (the traced edges: tests/plan/traced/test_extrapolate.py)."""

from __future__ import annotations

import pytest

from ampkit.plan.traced.sequence import _split, _through, check_length, seq_points


def test_the_check_length_is_above_the_step_unless_the_positions_stop_it():
    assert check_length(2048, 40960) == 4096
    assert check_length(2048, None) == 4096
    assert check_length(2048, 4096) == 4096
    assert check_length(4096, 4096) == 2048  # no room above: half
    assert check_length(1, 1) == 1  # a one-token step at its limit: no check can be made


def test_three_lengths_start_at_the_step_and_double_where_they_can():
    assert seq_points(2048, 40960) == [2048, 4096, 8192]
    assert seq_points(2048, 4096) == [2048, 4096, 1024]
    assert seq_points(2048, 2048) == [2048, 1024, 512]
    assert seq_points(3, 3) == [3, 1]  # a line through two: the shortest steps


@pytest.mark.parametrize(("p", "r"), [(7.0, 0.0), (3.0, 0.25), (0.0, 2.0)])
def test_a_samples_share_splits_into_its_linear_and_quadratic_parts(p, r):
    def share(t: int) -> float:
        return p * t + r * t * t

    got = _split(64, share(64), 128, share(128))
    assert got == pytest.approx((p, r))


def test_the_polynomial_through_the_points_is_exact():
    a, b, c = 5.0, -2.0, 0.5
    points = [8, 16, 32]
    values = [a + b * x + c * x * x for x in points]
    assert _through(points, values) == pytest.approx((a, b, c))
    assert _through(points[:2], values[:2])[2] == 0.0
