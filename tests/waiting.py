"""Waiting on a condition, not on a clock: a hung test fails with what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], bool], timeout: float = 8.0, what: str = "condition", interval: float = 0.05
) -> None:
    """Check ``condition`` every ``interval`` seconds until it holds; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
