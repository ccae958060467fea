"""The leader's share of retention (``store/retention.py``): one short batch at a time, only
in a step that had nothing else to do, at most every ``every_seconds`` (every
``again_seconds`` while the batches find work), each in its own transaction fenced like the
leader's decisions, sized from how long the last ones held (``BatchSize``), and each logged in
one line with what went and the cutoff."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from airflow_quota.store.retention import Batch, BatchLimits, Retention

log = logging.getLogger("airflow_quota.scheduler")

PRUNE_EVERY_SECONDS = 60.0
"""How often an idle leader looks for something to prune."""
PRUNE_AGAIN_SECONDS = 1.0
"""How soon after a batch that found work the next one may run: a backlog (retention just
turned on over a year of history) goes at about this many batches a second of idle leader."""


class LeaderPruning:
    """Retention as the leader runs it: ``when_idle`` after a step that did nothing else."""

    def __init__(
        self,
        sessions: Callable[[], Any],
        retention_days: float,
        every_seconds: float = PRUNE_EVERY_SECONDS,
        again_seconds: float = PRUNE_AGAIN_SECONDS,
        limits: BatchLimits | None = None,
    ) -> None:
        self.sessions = sessions
        self.retention = Retention(retention_days, limits or BatchLimits())
        self.every_seconds = every_seconds
        self.again_seconds = again_seconds
        self._next = float("-inf")
        self.last: Batch | None = None
        """The last batch that found work (tests and benchmarks read it)."""

    def when_idle(self, now: float, fence: Callable[[Session], None]) -> Batch | None:
        """One batch when one is due (``fence`` first in its transaction, so a leader that lost
        its lease prunes nothing); None when none was due or retention keeps everything."""
        if self.retention.retention_days <= 0 or now < self._next:
            return None
        started = time.perf_counter()
        with self.sessions() as session, session.begin():
            fence(session)
            batch = self.retention.batch(session, now)
        batch = dataclasses.replace(batch, seconds=time.perf_counter() - started)  # committed: the whole hold
        self.retention.held(batch, batch.seconds)  # sizes the next batch to the time budget
        if batch.kind == "none":
            self._next = now + self.every_seconds
            return batch
        self._next = now + self.again_seconds
        self.last = batch
        log.info(batch.line())
        return batch
