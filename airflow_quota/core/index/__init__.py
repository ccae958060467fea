"""Which queued jobs each placing step of the cycle looks at, and in what order.

Two indexes place the same way: ``full_scan`` looks at every queued job at every step (the
model taken literally, the reference); ``fast`` looks only at the jobs that might fit now,
with the per-share queues, the merged streams of its walk and every memo. The property tests
hold the fast one to the full scan's decisions (``tests/core/test_index_equivalence.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from airflow_quota.core.index import fast, full_scan
from airflow_quota.core.index.fast import CycleWork
from airflow_quota.core.lifecycle import Lifecycle

IndexName = Literal["fast", "full-scan"]
Placer = Callable[[Lifecycle, float, CycleWork], None]

PLACERS: dict[str, Placer] = {"fast": fast.place_queued, "full-scan": full_scan.place_queued}
"""Steps 2 to 5 of the cycle, by index."""
