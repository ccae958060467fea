"""The ``airflow`` backend: jobs that Airflow itself runs, through ``QuotaExecutor``.

A task that opts into ``QuotaExecutor`` becomes a quota job of this backend. The quota scheduler
decides for it as for any job (placement, borrowing, preemption), but what runs it is the Airflow
task, released by the executor in Airflow's scheduler once the job is placed. So this backend
does nothing itself:

- ``start`` is a no-op: the executor sees the placed attempt (``quota_attempts``) and releases
  the held task with the placement in its environment;
- ``stop`` records the request (``quota_task_reports``): the executor sees it, sends the task
  SIGTERM and, after the grace, stops it through Airflow's RESTARTING route (or reports a task it
  never released as stopped before it started);
- ``poll`` reads what the executor reported of the try (``quota_task_reports``,
  ``store/task_reports.py``): nothing yet is PENDING (placed, the task not yet running), then
  RUNNING, then how the try ended.

Nothing here times out: a placed job whose task never runs (Airflow's scheduler is down) stays
PENDING, holding its capacity, until the executor reports; the executor, restarted, adopts its
tasks and reports them.
"""

from __future__ import annotations

import time

from sqlalchemy import Engine

from airflow_quota.service.backends.base import AttemptReport, AttemptSpec, AttemptStatus
from airflow_quota.store.backend_names import EXECUTOR_BACKEND
from airflow_quota.store.engine import reachable, session_factory
from airflow_quota.store.models import TaskReport
from airflow_quota.store.task_reports import request_stop


class ExecutorBackend:
    """Attempts run by Airflow tasks under ``QuotaExecutor``; reads their reports from ``engine``.

    :param engine: the quota database (the one the executor writes its reports to).
    :param poll_interval_seconds: how often the scheduler reads each open attempt's report.
    """

    name: str = EXECUTOR_BACKEND

    def __init__(self, engine: Engine, poll_interval_seconds: float = 1.0) -> None:
        self.engine = engine
        self.sessions = session_factory(engine)
        self.poll_interval_seconds = poll_interval_seconds

    def start(self, attempt: AttemptSpec) -> None:
        """Nothing to start: the executor releases the task when it sees the placement."""

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        """Record the stop request for the executor, which sends the task SIGTERM and stops it
        after ``grace_seconds`` (or reports it stopped before it ever ran)."""
        with reachable(str(self.engine.url)), self.sessions() as session, session.begin():
            request_stop(session, attempt.job_id, attempt.attempt, grace_seconds, time.time())

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        """The executor's report of the attempt's try; PENDING until it sends one."""
        with reachable(str(self.engine.url)), self.sessions() as session:
            row = session.get(TaskReport, (attempt.job_id, attempt.attempt))
        if row is None or row.status == "PENDING":
            return AttemptReport(AttemptStatus.PENDING)
        return AttemptReport(AttemptStatus(row.status), row.reason, row.running_since, row.ended_at)
