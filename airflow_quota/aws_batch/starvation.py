"""Starvation of the jobs AWS Batch places (AWS raises no such alert): docs/model.md rules 8.1 to
8.3 applied to what the mirror sees; pure.

The threshold is the share's own (``core/normal_wait.py``: fixed, or ``starvation_multiple``
times the 90% point of the waits of its last 200 placements, here AWS's placements as mirrored).
A waiting job is overtaken by a later-submitted job placed on a type of its list, in its share,
or in any share when that placement borrows; it is starving once overtaken and past the
threshold, and alerts once. The mirror sees placements a round late, so an alert may come up to
a sweep after the moment the model names.

Cost: a placement is appended, nothing more; only a job past its threshold looks at the
placements made since it last became RUNNABLE, and each only once (it remembers how far it
looked). What a leader learns here lives in memory: a new leader takes the waits back from the
stored jobs (``learn``) and counts overtakes from the placements it sees.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from airflow_quota.aws_batch.service_jobs import KnownJob
from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.model import Alert, AlertKind, JobState
from airflow_quota.core.normal_wait import RecentWaits, Threshold, starvation_threshold

KEEP_PLACEMENTS = 100_000
"""The placements kept to look back on; past twice this, the older half is let go."""


@dataclass(frozen=True, slots=True)
class _Placement:
    at: float
    job_id: int
    share: str
    instance_type: str
    name: str
    borrowed: int


@dataclass(slots=True)
class _Look:
    """How far a waiting job has looked for its overtakers, and whom it found."""

    since: float
    next: int
    overtakers: list[str] = field(default_factory=list)


class DelegatedStarvation:
    """The shares' recent waits, the placements seen, who overtook each job past its threshold,
    and who has been alerted."""

    def __init__(self) -> None:
        self.waits: dict[str, RecentWaits] = {}
        self._placements: list[_Placement] = []
        self._ats: list[float] = []
        """Each placement's time as seen, never decreasing: where a job starts looking."""
        self._first = 0
        """The number of placements let go before ``_placements[0]``."""
        self._looks: dict[int, _Look] = {}
        self._alerted: set[int] = set()

    def learn(self, share: str, wait: float) -> None:
        """One placement of ``share`` that waited ``wait`` seconds."""
        self.waits.setdefault(share, RecentWaits()).add(wait)

    def alerted(self, job_id: int) -> None:
        """The job has had its STARVING alert (a new leader reads them back)."""
        self._alerted.add(job_id)

    def placed(self, job: KnownJob, instance_type: str, at: float, wait: float, borrowed: int) -> None:
        """AWS placed ``job`` on ``instance_type`` at ``at`` after ``wait`` seconds."""
        self.learn(job.share, wait)
        self._looks.pop(job.job_id, None)
        seen_at = max(at, self._ats[-1]) if self._ats else at
        self._placements.append(_Placement(seen_at, job.job_id, job.share, instance_type, job.name, borrowed))
        self._ats.append(seen_at)
        if len(self._placements) > 2 * KEEP_PLACEMENTS:
            drop = len(self._placements) - KEEP_PLACEMENTS
            del self._placements[:drop], self._ats[:drop]
            self._first += drop

    def requeued(self, job_id: int) -> None:
        """The job is RUNNABLE again: its overtakes count from now (rule 8.1)."""
        self._looks.pop(job_id, None)

    def alerts(self, config: QuotaConfig, waiting: Iterable[KnownJob], now: float) -> list[tuple[int, Alert]]:
        """A STARVING alert for each waiting job past its share's threshold and overtaken, once."""
        raised = []
        shares = {share.name: share for share in config.shares}
        thresholds: dict[str, Threshold] = {}  # each share's, once a round
        for job in waiting:
            share = shares.get(job.share)
            if job.state is not JobState.RUNNABLE or job.job_id in self._alerted or share is None:
                continue
            if job.runnable_since is None:
                continue
            waited = now - job.runnable_since
            threshold = thresholds.get(job.share)
            if threshold is None:
                threshold = thresholds[job.share] = starvation_threshold(
                    share, self.waits.get(job.share, RecentWaits())
                )
            if waited < threshold.seconds:
                continue
            overtakers = self._overtakers(job)
            if not overtakers:
                continue  # queueing, not starving: nobody overtook it
            count = len(overtakers)
            reason = (
                f"RUNNABLE for {waited:g} s, {threshold.past(waited)}; "
                f"overtaken by {count} later placement{'s' * (count != 1)}, latest {overtakers[-1]}"
            )
            alert = Alert(now, job.name, job.share, AlertKind.STARVING, reason, None, waited, count)
            raised.append((job.job_id, alert))
            self._alerted.add(job.job_id)
        return raised

    def _overtakers(self, job: KnownJob) -> list[str]:
        """Who overtook the job since it last became RUNNABLE: the placements after the ones it
        has looked at (rule 8.1)."""
        assert job.runnable_since is not None
        look = self._looks.get(job.job_id)
        if look is None or look.since != job.runnable_since or look.next < self._first:
            start = self._first + bisect.bisect_left(self._ats, job.runnable_since)
            look = self._looks[job.job_id] = _Look(job.runnable_since, start)
        for placement in self._placements[look.next - self._first :]:
            if placement.job_id <= job.job_id or placement.instance_type not in job.types:
                continue
            if placement.share == job.share or placement.borrowed > 0:
                look.overtakers.append(f"{placement.name} ({placement.share})")
        look.next = self._first + len(self._placements)
        return look.overtakers
