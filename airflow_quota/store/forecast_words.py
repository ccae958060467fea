"""A job's forecast (``quota_forecasts``) as people read it, the one wording for the command
line, the Quotas page's API and a waiting task's log: "around 14:20 UTC, likely 13:40-16:00,
on 2x ml.g5.xlarge borrowing 1 (it may be reclaimed); runtime estimate: task history"."""

from __future__ import annotations

from typing import Any

from airflow_quota.core.human_time import clock_time
from airflow_quota.store.models import ForecastRow


def forecast_record(row: ForecastRow | None) -> dict[str, Any] | None:
    """The forecast as ``--json`` and the API give it (instants in the core's seconds)."""
    if row is None:
        return None
    return {
        "made_at": row.made_at,
        "start": row.start,
        "low": row.low,
        "high": row.high,
        "end": row.end,
        "instance_type": row.instance_type,
        "count": row.count,
        "borrowed": row.borrowed,
        "preempts": row.preempts,
        "must_borrow": row.must_borrow,
        "estimate_source": row.source,
        "reason": row.reason,
    }


def forecast_words(row: ForecastRow, now: float) -> str:
    """One line: when a waiting job is expected to start (and how), or a running job to end."""
    if row.end is not None:
        return f"expected to end around {clock_time(row.end, now)}{_range(row, now)}; runtime estimate: {row.source}"
    if row.start is None:
        return f"no expected start: {row.reason}"
    how = f" on {row.count}x {row.instance_type}" if row.instance_type else ""
    if row.borrowed:
        how += f" borrowing {row.borrowed} (which its lenders may reclaim)"
    if row.preempts:
        how += " after preempting"
    if row.must_borrow:
        how += f"; it must borrow {row.must_borrow} at once, above its share's limit"
    return f"expected to start around {clock_time(row.start, now)}{_range(row, now)}{how}"


def forecast_short(row: ForecastRow, now: float) -> str:
    """A queue's column: "around 14:20 UTC (13:40 UTC to 16:00 UTC)", "ends around ...", or
    "unknown" when none can be given."""
    at = row.end if row.end is not None else row.start
    if at is None:
        return "unknown"
    ends = _ends(row, at, now)
    spread = f" ({ends[0]} to {ends[1]})" if ends else ""
    return f"{'ends around' if row.end is not None else 'around'} {clock_time(at, now)}{spread}"


MOVED = 0.10
"""How far a forecast must move, as a share of the wait it said was left, before a waiting
task's log says it again."""


def forecast_moved(said: ForecastRow | None, new: ForecastRow, now: float) -> bool:
    """Whether ``new`` is worth a log line after ``said``: the first one, a start given or lost,
    or a start that moved by more than ``MOVED`` of the wait ``said`` had left (a minute at least)."""
    if said is None or (said.start is None) != (new.start is None):
        return True
    if said.start is None or new.start is None:
        return said.reason != new.reason
    left = max(said.start - now, 60.0)
    return abs(new.start - said.start) > MOVED * left


def _range(row: ForecastRow, now: float) -> str:
    at = row.end if row.end is not None else row.start
    ends = _ends(row, at, now) if at is not None else None
    return f", likely {ends[0]} to {ends[1]}" if ends else ""


def _ends(row: ForecastRow, at: float, now: float) -> tuple[str, str] | None:
    """The range's ends as read, None without a range or when both read as the point ``at``
    does (a range of one time says nothing: "14:20 UTC to 14:20 UTC")."""
    if row.low is None:
        return None
    low = clock_time(row.low, now)
    high = clock_time(row.high, now) if row.high is not None else "later"
    return None if low == high == clock_time(at, now) else (low, high)
