"""What wait is normal in a share, and the starvation threshold drawn from it (docs/model.md
rule 8.2). A fixed threshold tuned on one cluster floods the alerts of a busier one; a
threshold drawn from the share's own recent waits travels."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sortedcontainers import SortedList

from airflow_quota.core.config import Share

KEEP_WAITS = 200
"""How many of a share's latest placements its normal wait is drawn from."""
MIN_WAITS = 20
"""Fewer placements than this and a share's normal wait is not known yet."""
NORMAL_QUANTILE = 0.9
"""The quantile of the recent waits that is the share's normal wait."""


class RecentWaits:
    """The waits of a share's latest ``KEEP_WAITS`` placements, in order and sorted."""

    __slots__ = ("_in_order", "_sorted")

    def __init__(self) -> None:
        self._in_order: deque[float] = deque()
        self._sorted: SortedList = SortedList()

    def add(self, wait: float) -> None:
        self._in_order.append(wait)
        self._sorted.add(wait)
        if len(self._in_order) > KEEP_WAITS:
            self._sorted.remove(self._in_order.popleft())

    def __len__(self) -> int:
        return len(self._in_order)

    def normal(self) -> float | None:
        """The share's normal wait: the ``NORMAL_QUANTILE`` of its recent waits; None while
        fewer than ``MIN_WAITS`` are known."""
        if len(self._sorted) < MIN_WAITS:
            return None
        return float(self._sorted[min(len(self._sorted) - 1, int(NORMAL_QUANTILE * len(self._sorted)))])


UNKNOWN_NORMAL_SECONDS = 172800.0
"""The threshold of a share whose normal wait is not known yet: 48 h, model v4's fixed default."""


@dataclass(frozen=True, slots=True)
class Threshold:
    """How long a job of a share waits before it may be starving (docs/model.md rule 8.2), and why."""

    seconds: float
    normal: float | None = None
    """The share's normal wait it was drawn from; None for a fixed threshold or an unknown normal."""
    fixed: bool = False
    drawn_from: int = 0
    """How many placements' waits the normal wait was drawn from."""

    def past(self, waited: float) -> str:
        """By how much a wait of ``waited`` seconds is past this threshold, in words."""
        threshold = f"past its threshold of {self.seconds:.0f} s"
        if self.fixed:
            return f"{threshold} (starvation_after_seconds)"
        if self.normal is None:
            return f"{threshold} (its share has placed fewer than {MIN_WAITS} jobs: no normal wait yet)"
        normal = f"the {NORMAL_QUANTILE:.0%} point of its last {self.drawn_from} placements' waits"
        if self.normal == 0:
            return f"{threshold} (starvation_min_seconds; its share's normal wait is 0 s, {normal})"
        return f"{threshold}, {waited / self.normal:.1f}x its share's normal wait of {self.normal:.0f} s ({normal})"


def starvation_threshold(share: Share, waits: RecentWaits) -> Threshold:
    """The share's threshold now: its fixed ``starvation_after_seconds``, or ``starvation_multiple``
    times its normal wait and at least ``starvation_min_seconds``."""
    if share.starvation_after_seconds is not None:
        return Threshold(share.starvation_after_seconds, fixed=True)
    normal = waits.normal()
    if normal is None:
        return Threshold(max(share.starvation_min_seconds, UNKNOWN_NORMAL_SECONDS))
    return Threshold(
        max(share.starvation_min_seconds, share.starvation_multiple * normal), normal, drawn_from=len(waits)
    )
