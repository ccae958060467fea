"""One core, two clocks: the service reads the wall clock; tests drive a manual one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (or since the scenario's start, for a manual clock)."""


class WallClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self.time = start

    def now(self) -> float:
        return self.time

    def advance_to(self, at: float) -> None:
        if at < self.time:
            raise ValueError(f"time {at} is before the clock's {self.time}: a clock does not go back")
        self.time = at
