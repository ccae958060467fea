"""A share's normal wait and its starvation threshold (``core/normal_wait.py``, docs/model.md
rule 8.2): the quantile of the latest waits, the window, the unknown normal, the two kinds of
threshold, and a configuration that mixes them refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_quota.core.config import Share, parse_config
from airflow_quota.core.normal_wait import (
    KEEP_WAITS,
    MIN_WAITS,
    UNKNOWN_NORMAL_SECONDS,
    RecentWaits,
    starvation_threshold,
)
from airflow_quota.exceptions import InvalidInput

SHARE = Share(name="a", capacity_limits={"ml.g5.xlarge": 1}, starvation_min_seconds=100)


def waits_of(values: list[float]) -> RecentWaits:
    waits = RecentWaits()
    for value in values:
        waits.add(value)
    return waits


def test_the_normal_wait_is_unknown_until_enough_placements() -> None:
    waits = waits_of([10.0] * (MIN_WAITS - 1))
    assert waits.normal() is None
    assert starvation_threshold(SHARE, waits).seconds == UNKNOWN_NORMAL_SECONDS
    waits.add(10.0)
    assert waits.normal() == 10.0


def test_the_normal_wait_is_the_90_percent_point_of_the_latest_waits() -> None:
    waits = waits_of([float(10 * i) for i in range(20)])  # 0 .. 190
    assert waits.normal() == 180.0
    threshold = starvation_threshold(SHARE, waits)
    assert (threshold.seconds, threshold.normal, threshold.drawn_from) == (8 * 180.0, 180.0, 20)
    assert threshold.past(2880.0).startswith("past its threshold of 1440 s, 16.0x its share's normal wait of 180 s")


def test_only_the_latest_waits_count() -> None:
    waits = waits_of([1_000_000.0] * KEEP_WAITS + [5.0] * KEEP_WAITS)
    assert len(waits) == KEEP_WAITS
    assert waits.normal() == 5.0


@given(st.lists(st.floats(0, 1e7), min_size=MIN_WAITS, max_size=3 * KEEP_WAITS))
def test_the_normal_wait_is_a_sorted_window_of_what_came_last(values: list[float]) -> None:
    window = sorted(values[-KEEP_WAITS:])
    assert waits_of(values).normal() == window[int(0.9 * len(window))]


def test_the_minimum_holds_where_most_jobs_wait_no_time() -> None:
    threshold = starvation_threshold(SHARE, waits_of([0.0] * 30))
    assert threshold.seconds == 100
    assert "starvation_min_seconds; its share's normal wait is 0 s" in threshold.past(100)


def test_a_fixed_threshold_ignores_the_waits() -> None:
    share = Share(name="a", capacity_limits={"ml.g5.xlarge": 1}, starvation_after_seconds=3600)
    threshold = starvation_threshold(share, waits_of([1e6] * 50))
    assert (threshold.seconds, threshold.fixed) == (3600, True)
    assert threshold.past(4000) == "past its threshold of 3600 s (starvation_after_seconds)"


@pytest.mark.parametrize("field", ["starvation_multiple", "starvation_min_seconds"])
def test_a_fixed_threshold_with_an_adaptive_setting_is_refused_naming_both(field: str) -> None:
    raw = {
        "pool": {"capacity": {"ml.g5.xlarge": 1}},
        "shares": [
            {"name": "a", "capacity_limits": {"ml.g5.xlarge": 1}, "starvation_after_seconds": 60, field: 3},
        ],
    }
    with pytest.raises(InvalidInput) as refused:
        parse_config(raw)
    message = str(refused.value)
    assert "shares[0]" in message and field in message and "starvation_after_seconds" in message
