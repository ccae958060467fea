"""Starvation of the jobs AWS Batch places (AWS raises no such alert): docs/model.md rules 8.1 to
8.3 applied to what the mirror sees; pure.

The threshold is the share's own (``core/normal_wait.py``: fixed, or ``starvation_multiple``
times the 90% point of the waits of its last 200 placements, here AWS's placements as mirrored).
A waiting job is overtaken by a later-submitted job placed on a type of its list, in its share,
or in any share when that placement borrows; it is starving once overtaken and past the
threshold, and alerts once. The mirror sees placements a round late, so an alert may come up to
a sweep after the moment the model names. What a leader learns here lives in memory: a new leader
takes the waits back from the stored jobs (``learn``) and forgets overtakes, which the next
placements count anew.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_quota.aws_batch.service_jobs import KnownJob
from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.model import Alert, AlertKind, JobState
from airflow_quota.core.normal_wait import RecentWaits, starvation_threshold


class DelegatedStarvation:
    """The shares' recent waits, who overtook each waiting job, and who has been alerted."""

    def __init__(self) -> None:
        self.waits: dict[str, RecentWaits] = {}
        self._overtakers: dict[int, list[str]] = {}
        self._alerted: set[int] = set()

    def learn(self, share: str, wait: float) -> None:
        """One placement of ``share`` that waited ``wait`` seconds."""
        self.waits.setdefault(share, RecentWaits()).add(wait)

    def alerted(self, job_id: int) -> None:
        """The job has had its STARVING alert (a new leader reads them back)."""
        self._alerted.add(job_id)

    def placed(
        self, job: KnownJob, instance_type: str, wait: float, borrowed: int, waiting: Iterable[KnownJob]
    ) -> None:
        """AWS placed ``job`` on ``instance_type`` after ``wait`` seconds: its share's wait, and an
        overtake of each earlier-submitted job still waiting for that type (rule 8.1)."""
        self.learn(job.share, wait)
        self._overtakers.pop(job.job_id, None)
        for other in waiting:
            if other.job_id >= job.job_id or instance_type not in other.types:
                continue
            if other.share == job.share or borrowed > 0:
                self._overtakers.setdefault(other.job_id, []).append(f"{job.name} ({job.share})")

    def requeued(self, job_id: int) -> None:
        """The job is RUNNABLE again: its overtakes count from now (rule 8.1)."""
        self._overtakers.pop(job_id, None)

    def alerts(self, config: QuotaConfig, waiting: Iterable[KnownJob], now: float) -> list[tuple[int, Alert]]:
        """A STARVING alert for each waiting job overtaken and past its share's threshold, once."""
        raised = []
        for job in waiting:
            overtakers = self._overtakers.get(job.job_id)
            share = config.share(job.share)
            if job.state is not JobState.RUNNABLE or job.job_id in self._alerted or not overtakers or share is None:
                continue
            assert job.runnable_since is not None
            waited = now - job.runnable_since
            threshold = starvation_threshold(share, self.waits.get(job.share, RecentWaits()))
            if waited < threshold.seconds:
                continue
            count = len(overtakers)
            reason = (
                f"RUNNABLE for {waited:g} s, {threshold.past(waited)}; "
                f"overtaken by {count} later placement{'s' * (count != 1)}, latest {overtakers[-1]}"
            )
            raised.append(
                (job.job_id, Alert(now, job.name, job.share, AlertKind.STARVING, reason, None, waited, count))
            )
            self._alerted.add(job.job_id)
        return raised
