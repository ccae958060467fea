"""Garbage collection for long runs: a batch run (a simulation, a trace's mapping, a comparison)
collects less often; the quota scheduler's leader freezes what lives long (``freeze_long_lived``).

A run keeps every job and decision for its report, so the heap grows with the run. With
CPython's default thresholds (700, 10, 10) the collector runs a full collection every time
the long-lived objects grow by a quarter, and each one walks the whole heap: on the 100k-job
full load that was 12 full collections and about a sixth of the CPU time, and the cost per job grew
with the run (docs/design-notes.md, "Garbage collection in a batch run"). The simulator makes no
reference cycles (a collection after a whole run with the collector off finds nothing to
free: ``tests/sim/test_gc_tuning.py``), so collecting less often frees the same memory, by
reference counting, and costs none. The thresholds are mypy's for its builds.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

BATCH_THRESHOLDS = (200_000, 30, 30)
"""Allocations before a young collection, then young collections before the next generation's."""


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the block with ``BATCH_THRESHOLDS``, then put the caller's thresholds back. The
    thresholds are the process's: runs in several threads at once may leave them raised."""
    before = gc.get_threshold()
    gc.set_threshold(*BATCH_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def freeze_long_lived() -> None:
    """Collect once, then move every object alive now out of the collector's sight
    (``gc.freeze``): the modules imported and the core's state a leader just recovered or wrote
    a snapshot of. A full collection walks every object it sees, 60-80 ms for what importing
    ``airflow_quota`` alone makes, paid by whatever step or prune batch triggers it; frozen
    objects are never walked again, and those that die are freed by reference counting, as the
    core makes no reference cycles. The quota scheduler calls it after recovery and after each
    snapshot (``QuotaService.run``)."""
    gc.collect()
    gc.freeze()
