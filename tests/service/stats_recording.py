"""A StatsD stand-in that keeps every call, for the tests of the quota scheduler's metrics
(``test_metrics``, ``test_heartbeat``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class Recording:
    """A ``StatsBackend`` that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, dict[str, str] | None]] = []

    def incr(self, stat: str, count: int = 1, *, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("incr", stat, count, tags))

    def gauge(self, stat: str, value: float, *, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("gauge", stat, value, tags))

    def timing(self, stat: str, dt: timedelta, *, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("timing", stat, dt, tags))
