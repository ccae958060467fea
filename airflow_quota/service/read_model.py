"""What readers see of the core's state, written by the leader: the shares' view
(``store/views.py``: the Quotas page, ``airflow-quota shares``, the gauges) and the columns of
``quota_jobs`` the scheduler owns (state, pending reason, positions, measures).

Both are derived from the core after its decisions; neither is read back by the leader. The
view is kept as last committed, so an unchanged one is not written again, and while steps follow
one another it may fall ``view_seconds`` behind (``QuotaService``'s parameter of that name).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sqlalchemy.orm import Session

from airflow_quota.core.model import Job, JobState
from airflow_quota.core.state import QuotaState
from airflow_quota.core.visibility import pending_view
from airflow_quota.store.bulk import update_by_key
from airflow_quota.store.models import JobRow
from airflow_quota.store.views import QuotaView, ViewBuilder, write_view


class ReadModel:
    """The leader's writer of what readers see.

    :param view_seconds: the most the view may fall behind the commits while steps follow one
        another (wall-clock seconds; 0: written in every commit that changes it).
    :param refresh_views_seconds: how often every waiting job's pending reason and positions
        are written, besides the jobs a commit touched (they move when anything ahead does).
    """

    def __init__(self, view_seconds: float, refresh_views_seconds: float) -> None:
        self.view_seconds = view_seconds
        self.refresh_views_seconds = refresh_views_seconds
        self.view: QuotaView | None = None
        """The shares' view as last committed; None before the first (or after recovery)."""
        self.behind = False
        """Whether a commit changed the core's state since the view was last written."""
        self._views = ViewBuilder()
        """What computes the view, keeping each share's waiting figures until its queue changes."""
        self._written = float("-inf")
        """When (``time.monotonic``) the view was last written."""
        self._last_refresh = float("-inf")

    def write_jobs(self, session: Session, state: QuotaState, touched: set[int], now: float) -> None:
        """Write the touched jobs as they now stand; every ``refresh_views_seconds``, every
        waiting job too."""
        if now - self._last_refresh >= self.refresh_views_seconds:
            self._last_refresh = now
            touched = touched | {job.ref for job in state.jobs.values() if job.state is JobState.RUNNABLE and job.ref}
        changes = [
            job_columns(state.jobs[state.refs[job_id]], state, now)
            for job_id in sorted(touched)
            if job_id in state.refs
        ]
        if changes:
            update_by_key(session, JobRow, changes)  # one executemany: an UPDATE by primary key

    def in_commit(self, session: Session, state: QuotaState | None, now: float) -> tuple[QuotaView | None, bool]:
        """The view to hold once the commit lands, written in its transaction unless it may
        stay behind (``view_seconds``) or there is no state yet, and whether it is behind."""
        behind = time.monotonic() - self._written < self.view_seconds
        if behind or state is None:
            return self.view, behind
        return self.write_view(session, state, now), behind

    def write_view(self, session: Session, state: QuotaState, now: float) -> QuotaView | None:
        """The shares' view of the core's state, written in the session's transaction when it
        differs from the one last committed; returned either way."""
        view = self._views.view_of(state, now)
        self._written = time.monotonic()
        if self.view is not None and view == self.view:
            # unchanged: the stored one, computed when it last changed, valid until the next timer
            return dataclasses.replace(self.view, valid_until=view.valid_until)
        write_view(session, view, stored=self.view)
        return view

    def committed(self, view: QuotaView | None, behind: bool = False) -> None:
        """The transaction that wrote (or left) ``view`` has committed."""
        self.view = view
        self.behind = behind

    def due(self, now: float) -> bool:
        """Whether time alone changed what a new job could be placed on (a plan window opens or
        closes, a back-off ends) since the view was written: then it is written again."""
        return self.view is not None and self.view.valid_until is not None and now >= self.view.valid_until


def job_columns(job: Job, state: QuotaState, now: float) -> dict[str, Any]:
    """The columns of ``quota_jobs`` that the scheduler owns, for one job as it now stands."""
    last = job.last_placement
    columns: dict[str, Any] = {
        "id": job.ref,
        "state": job.state.value,
        "priority": job.priority,
        "reason": job.failure.value if job.failure else None,
        "detail": job.failure_detail,
        "attempts": job.attempts,
        "preemptions": len(job.preemptions),
        "wait_seconds": job.wait_seconds,
        "instance_type": last.instance_type if last else None,
        "count": last.count if last else None,
        "training_plan": last.training_plan if last else None,
        "borrowed": job.last_borrowed,
        "gpu_hours": job.gpu_seconds / 3600,
        "lost_gpu_hours": job.lost_gpu_seconds / 3600,
        "cost": job.cost,
        "pending_reason": None,
        "waiting_for": None,
        "position_in_share": None,
        "position_in_queue": None,
        "runnable_since": None,
        "pending_deadline": None,
        "updated_at": now,
    }
    if job.state is JobState.RUNNABLE:
        columns.update(
            pending_view(state, job, now), runnable_since=job.runnable_since, pending_deadline=job.pending_deadline
        )
    return columns
