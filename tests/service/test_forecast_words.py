"""A forecast in words (``store/forecast_words.py``), the one wording of the command line, the
Quotas page and a waiting task's log."""

from __future__ import annotations

from airflow_quota.store.forecast_words import forecast_short, forecast_words
from airflow_quota.store.models import ForecastRow

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
HOUR = 3600.0


def row(start: float | None, low: float | None, high: float | None, end: float | None = None) -> ForecastRow:
    return ForecastRow(
        job_id=1,
        made_at=NOW,
        start=start,
        low=low,
        high=high,
        end=end,
        instance_type="ml.g5.xlarge" if end is None else None,
        count=1 if end is None else None,
        borrowed=0,
        preempts=False,
        must_borrow=0,
        source="task history",
        reason=None,
    )


def test_a_range_is_said_with_its_ends() -> None:
    spread = row(NOW + 2 * HOUR, NOW + HOUR, NOW + 3 * HOUR)
    assert forecast_short(spread, NOW) == "around 10:00 UTC (09:00 UTC to 11:00 UTC)"
    assert forecast_words(spread, NOW) == (
        "expected to start around 10:00 UTC, likely 09:00 UTC to 11:00 UTC on 1x ml.g5.xlarge"
    )
    assert forecast_short(row(NOW + 2 * HOUR, NOW + HOUR, None), NOW) == "around 10:00 UTC (09:00 UTC to later)"


def test_a_range_that_reads_as_its_point_is_left_out() -> None:
    """Forecasts whose runs all agree (one runtime each, nothing calibrated yet) have a range of
    one instant: "(10:00 UTC to 10:00 UTC)" would say nothing."""
    point = row(NOW + 2 * HOUR, NOW + 2 * HOUR + 5, NOW + 2 * HOUR + 10)
    assert forecast_short(point, NOW) == "around 10:00 UTC"
    assert forecast_words(point, NOW) == "expected to start around 10:00 UTC on 1x ml.g5.xlarge"
    ending = row(None, NOW + HOUR, NOW + HOUR, end=NOW + HOUR)
    assert forecast_short(ending, NOW) == "ends around 09:00 UTC"
    assert forecast_words(ending, NOW) == "expected to end around 09:00 UTC; runtime estimate: task history"
