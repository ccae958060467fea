"""Durations and instants as people read them, in the CLI's tables, the simulator's reports and
the task log: "2 hours 5 minutes", "about 3 days", "14:20 UTC". The one way the project
writes time for people, built on pendulum's words (the library Airflow users write
``start_date`` with).

Only text for people goes through here: JSON fields, metrics and the decision log keep their
numbers of seconds and their ISO instants, which programs read.
"""

from __future__ import annotations

import math

import pendulum

LOCALE = "en"
"""Every text is English, whatever pendulum's process-wide locale (a DAG may set another)."""

_UNITS = (604800, 86400, 3600, 60, 1)
"""Week, day, hour, minute, second: the units pendulum's words use, largest first."""


def duration_words(seconds: float, units: int = 2) -> str:
    """``seconds`` in words, to its ``units`` largest units, rounded at the last of them:
    ``duration_words(5430)`` is "1 hour 31 minutes", ``duration_words(5430, units=1)`` "2
    hours"; under half a second is "less than a second" (none is "0 seconds"). Precise
    enough to compare two waits (two units are within 1 %), short enough for a table cell."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration is a finite number of seconds ≥ 0, not {seconds!r}")
    largest = next((i for i, size in enumerate(_UNITS) if seconds >= size), len(_UNITS) - 1)
    step = _UNITS[min(largest + units - 1, len(_UNITS) - 1)]
    rounded = math.floor(seconds / step + 0.5) * step  # half up: 90.5 minutes is 91
    if rounded == 0:
        return "0 seconds" if seconds == 0 else "less than a second"
    return pendulum.duration(seconds=rounded).in_words(locale=LOCALE)


def about(seconds: float) -> str:
    """A rough duration for a sentence: "about 2 hours", "about 45 seconds" (one unit)."""
    return f"about {duration_words(seconds, units=1)}"


def clock_time(epoch_seconds: float, now: float | None = None) -> str:
    """An instant on a UTC clock: "14:20 UTC" on the same UTC day as ``now`` (epoch seconds),
    "2026-12-01 14:20 UTC" on another day or without ``now``."""
    instant = pendulum.from_timestamp(epoch_seconds, tz="UTC")
    if now is not None and pendulum.from_timestamp(now, tz="UTC").date() == instant.date():
        return instant.format("HH:mm [UTC]", locale=LOCALE)
    return instant.format("YYYY-MM-DD HH:mm [UTC]", locale=LOCALE)
