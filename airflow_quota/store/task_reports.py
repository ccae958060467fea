"""The meeting point of ``QuotaExecutor`` and the quota scheduler's ``airflow`` backend.

A job of the ``airflow`` backend is run by Airflow itself: ``QuotaExecutor`` (in Airflow's
scheduler) holds the task QUEUED until the quota scheduler places the job, then runs it. The two
processes share nothing but the quota database, so what each needs of the other is read here:

- the executor reads the attempts the quota scheduler placed or is stopping
  (:func:`open_attempts`, from ``quota_attempts`` as the scheduler writes it);
- the executor writes what became of the Airflow try running an attempt
  (:func:`write_report`, into ``quota_task_reports``), and the backend's ``poll`` reads it
  (:func:`read_reports`);
- the backend's ``stop`` writes a stop request on the same row (:func:`request_stop`), and the
  executor reads it: the attempt's row in ``quota_attempts`` cannot carry it, since the scheduler
  rewrites its status from each poll.

Each report is keyed on the attempt (job id, attempt number) and rewritten in place, so a report
written twice (an executor restarted after a crash) changes nothing.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_quota.store.models import Attempt, TaskReport

REPORT_STATUSES = ("RUNNING", "SUCCEEDED", "FAILED", "STOPPED")
"""What the executor reports of a try (``AttemptStatus`` values of the backend interface)."""

IN_CHUNK = 500


@dataclass(frozen=True, slots=True)
class OpenAttempt:
    """An attempt of a job as the quota scheduler last wrote it, for the executor."""

    job_id: int
    number: int
    instance_type: str
    count: int
    training_plan: str | None
    status: str
    """An ``AttemptState`` value: PLACED, PENDING (the backend was told to start it), RUNNING,
    STOPPING (preempted or cancelled: the executor must stop the try) and so on."""
    stop_grace: float
    ended: bool


def latest_attempts(session: Session, job_ids: Collection[int]) -> dict[int, OpenAttempt]:
    """Per job, its latest attempt (the highest number), for the jobs that have one."""
    wanted = sorted(set(job_ids))
    found: dict[int, OpenAttempt] = {}
    for start in range(0, len(wanted), IN_CHUNK):
        query = select(Attempt).where(Attempt.job_id.in_(wanted[start : start + IN_CHUNK]))
        for row in session.scalars(query):
            known = found.get(row.job_id)
            if known is None or row.number > known.number:
                found[row.job_id] = OpenAttempt(
                    row.job_id,
                    row.number,
                    row.instance_type,
                    row.count,
                    row.training_plan,
                    row.status,
                    row.stop_grace,
                    row.ended_at is not None,
                )
    return found


def write_report(
    session: Session,
    job_id: int,
    attempt: int,
    status: str,
    at: float,
    reason: str | None = None,
    try_number: int | None = None,
) -> None:
    """Record what became of an attempt's try (in the caller's transaction). RUNNING keeps the
    first time it was reported; an ended attempt keeps its first ending (a later report of the
    same try changes nothing)."""
    if status not in REPORT_STATUSES:
        raise ValueError(f"status: {status!r} is not one of {', '.join(REPORT_STATUSES)}")
    row = session.get(TaskReport, (job_id, attempt))
    if row is None:
        row = TaskReport(job_id=job_id, attempt=attempt, status=status, updated_at=at, try_number=try_number)
        session.add(row)
    elif row.ended_at is not None:
        return
    row.status, row.updated_at = status, at
    if try_number is not None:
        row.try_number = try_number
    if status == "RUNNING":
        row.running_since = row.running_since or at
    else:
        row.reason, row.ended_at = reason, at


def request_stop(session: Session, job_id: int, attempt: int, grace: float, at: float) -> None:
    """Ask the executor to stop an attempt's try within ``grace`` seconds (in the caller's
    transaction). A second request keeps the first one's time and can only shorten the grace
    (a cancel during a preemption's grace)."""
    row = session.get(TaskReport, (job_id, attempt))
    if row is None:
        row = TaskReport(job_id=job_id, attempt=attempt, status="PENDING", updated_at=at)
        session.add(row)
    if row.stop_requested_at is None:
        row.stop_requested_at, row.stop_grace = at, max(grace, 0.0)
    else:
        row.stop_grace = min(row.stop_grace if row.stop_grace is not None else grace, max(grace, 0.0))
    row.updated_at = at


def read_reports(session: Session, keys: Collection[tuple[int, int]]) -> dict[tuple[int, int], TaskReport]:
    """The reports of these attempts that exist, by (job id, attempt)."""
    wanted = set(keys)
    job_ids = sorted({job_id for job_id, _ in wanted})
    found: dict[tuple[int, int], TaskReport] = {}
    for start in range(0, len(job_ids), IN_CHUNK):
        query = select(TaskReport).where(TaskReport.job_id.in_(job_ids[start : start + IN_CHUNK]))
        for row in session.scalars(query):
            if (row.job_id, row.attempt) in wanted:
                found[row.job_id, row.attempt] = row
    return found
