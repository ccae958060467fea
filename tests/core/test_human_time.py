"""Time for people (``core.human_time``): durations in pendulum's words to two units, rounded
half up at the last; rough durations for sentences; instants on a UTC clock."""

from __future__ import annotations

import math

import pendulum
import pytest

from airflow_quota.core.human_time import about, clock_time, duration_words

DEC_3_14_20 = pendulum.datetime(2026, 12, 3, 14, 20, 5).timestamp()


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        pytest.param(0, "0 seconds", id="nothing"),
        pytest.param(0.4, "less than a second", id="under half a second: not nothing"),
        pytest.param(1, "1 second", id="one second: singular"),
        pytest.param(45, "45 seconds", id="seconds"),
        pytest.param(61, "1 minute 1 second", id="minutes and seconds"),
        pytest.param(119.6, "2 minutes", id="rounded at the second: 120 s"),
        pytest.param(5430, "1 hour 31 minutes", id="rounded half up at the minute: 90.5 is 91"),
        pytest.param(3599.7, "1 hour", id="rounding that reaches the next unit"),
        pytest.param(90000, "1 day 1 hour", id="days and hours"),
        pytest.param(172800, "2 days", id="the default starvation threshold"),
        pytest.param(8 * 86400 + 3 * 3600, "1 week 1 day", id="weeks and days: hours dropped"),
    ],
)
def test_a_duration_in_words_to_its_two_largest_units(seconds: float, words: str) -> None:
    assert duration_words(seconds) == words


def test_a_rough_duration_has_one_unit() -> None:
    assert [about(5430), about(45), about(90000)] == ["about 2 hours", "about 45 seconds", "about 1 day"]


@pytest.mark.parametrize("seconds", [-1, math.inf, math.nan])
def test_a_duration_is_finite_and_not_negative(seconds: float) -> None:
    with pytest.raises(ValueError, match="a duration is a finite number of seconds ≥ 0"):
        duration_words(seconds)


def test_the_words_are_english_whatever_the_process_locale() -> None:
    previous = pendulum.get_locale()
    pendulum.set_locale("fr")
    try:
        assert duration_words(5430) == "1 hour 31 minutes"
    finally:
        pendulum.set_locale(previous)


def test_an_instant_on_a_utc_clock_has_its_date_unless_it_is_today() -> None:
    assert clock_time(DEC_3_14_20, now=DEC_3_14_20 + 3600) == "14:20 UTC"
    assert clock_time(DEC_3_14_20, now=DEC_3_14_20 + 86400) == "2026-12-03 14:20 UTC"
    assert clock_time(DEC_3_14_20) == "2026-12-03 14:20 UTC"
