"""Waiting on a condition, not on a clock: a hung test fails with what it waited for.

The one polling loop of the tests: ``wait_for`` in plain code, ``wait_for_async`` inside an
event loop (it lets the loop run between checks). Each has a deadline; ``what`` names what was
awaited in the failure, and may be a function, called only then, for details known at the end
(the last reading, the logs' tails). ``check`` runs before every poll and raises when waiting on
is hopeless (a process the condition depends on has died), so the test fails at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

Description = str | Callable[[], str]
"""What a wait is for: text, or a function giving it when the wait fails."""


def _timed_out(what: Description, timeout: float) -> AssertionError:
    said = what() if callable(what) else what
    return AssertionError(f"timed out after {timeout:g} s waiting for {said}")


def wait_for(
    condition: Callable[[], object],
    timeout: float = 8.0,
    what: Description = "condition",
    interval: float = 0.05,
    *,
    check: Callable[[], None] | None = None,
) -> None:
    """Check ``condition`` every ``interval`` seconds until it holds; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        if condition():
            return
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout)
        time.sleep(interval)


async def wait_for_async(
    condition: Callable[[], object], timeout: float = 30.0, what: Description = "condition", interval: float = 0.01
) -> None:
    """``wait_for`` inside an event loop: the loop runs the other tasks between two checks."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout)
        await asyncio.sleep(interval)
