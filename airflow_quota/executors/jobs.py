"""The quota side of ``QuotaExecutor``: one quota job per task instance, found or submitted once.

Everything here talks to the quota database through ``QuotaHook`` and ``store/task_reports.py``;
nothing touches Airflow's executor machinery, so the rules can be read (and tested) on their own:

- a task instance's job is keyed on the task instance, not its try (the operator's
  ``client_token``): a re-queue, an adoption after a scheduler restart or the next try after a
  preemption finds the live job again and never submits twice;
- a new job (``-rN``) is submitted only after the previous one ended for good (its try failed,
  succeeded and the task was cleared, or it timed out), never for the try that follows a
  preemption or a cancel that ended the job: that try fails with the job's reason.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import select

from airflow_quota.core.access import Actor
from airflow_quota.core.model import LIVE_STATES, FailureReason
from airflow_quota.exceptions import InvalidInput, SubmissionRejected
from airflow_quota.hooks.quota import QuotaHook, describe_job
from airflow_quota.operators.arguments import expected_runtime_seconds, job_request
from airflow_quota.operators.training import client_token, derived_job_name
from airflow_quota.store.backend_names import EXECUTOR_BACKEND
from airflow_quota.store.engine import reachable
from airflow_quota.store.models import ForecastRow, JobRow, TaskReport
from airflow_quota.store.repository import IN_CHUNK
from airflow_quota.store.task_reports import OpenAttempt, latest_attempts, read_reports, write_report

ENDED_BY_STOP = (FailureReason.PREEMPTION_LIMIT.value, FailureReason.CANCELLED.value)
"""Reasons a job ends while its try is being stopped: the try Airflow runs next must fail too."""


class TaskRefused(Exception):
    """The task cannot run under the quota shares; the message says why (it fails the task)."""


@dataclass(frozen=True, slots=True)
class TaskIdentity:
    """The Airflow task instance a quota job belongs to, and the try at hand."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int

    def token(self, generation: int) -> str:
        return client_token(self.dag_id, self.task_id, self.run_id, self.map_index, generation)


class JobProgress(NamedTuple):
    """What the executor reads of every held job at each sync (``ExecutorJobs.states``)."""

    state: str
    attempts: int
    pending_deadline: float | None
    """When a RUNNABLE job's ``max_pending_time`` falls due (``JobRow.pending_deadline``)."""
    pending_reason: str | None = None
    """Why a RUNNABLE job waits, what for and where it stands: the task's log says it once the
    try starts (``executors/story.py``)."""
    waiting_for: str | None = None
    position_in_share: int | None = None
    position_in_queue: int | None = None


class ExecutorJobs:
    """The executor's reads and writes of the quota database.

    :param quota_conn_id: the Airflow connection of the quota database.
    """

    def __init__(self, quota_conn_id: str = QuotaHook.default_conn_name) -> None:
        self.hook = QuotaHook(quota_conn_id)

    def job_for(self, task: TaskIdentity, arguments: dict[str, Any], priority: int | None, actor: Actor) -> JobRow:
        """The task instance's live job, else a new submission as ``actor`` (the share's access
        rules); ``TaskRefused`` when the quota refuses it or when the job ended while stopping
        the previous try."""
        generation, found = 1, None
        while (job := self.hook.get_job_by_token(task.token(generation))) is not None:
            found, generation = job, generation + 1
        if found is not None:
            if found.state in LIVE_STATES and not self.hook.cancel_requested(found.id):
                return found
            if found.reason in ENDED_BY_STOP and self._stopped_try(found) == task.try_number - 1:
                raise TaskRefused(describe_job(found))
        else:
            generation = 1
        name = derived_job_name(task.dag_id, task.task_id, task.run_id, task.map_index, generation)
        try:
            request = job_request(arguments, name, priority)
            return self.hook.submit(
                request,
                EXECUTOR_BACKEND,
                {"map_index": task.map_index, "try_number": task.try_number},
                client_token=task.token(generation),
                dag_id=task.dag_id,
                task_id=task.task_id,
                run_id=task.run_id,
                actor=actor,
                priority_overridden=priority is not None,
                map_index=task.map_index,
                expected_runtime_seconds=expected_runtime_seconds(arguments.get("expected_runtime")),
            )
        except (SubmissionRejected, InvalidInput, ValueError) as exc:
            raise TaskRefused(f"quota job {name!r} was not submitted: {exc}") from exc

    def _stopped_try(self, job: JobRow) -> int | None:
        """The Airflow try whose stop ended ``job`` (its last attempt's report), if one did."""
        reports = self.reports({(job.id, job.attempts)})
        report = reports.get((job.id, job.attempts))
        return report.try_number if report is not None and report.status == "STOPPED" else None

    def jobs(self, job_ids: Collection[int]) -> dict[int, JobRow]:
        return {row.id: row for row in self.hook.store.jobs_by_ids(job_ids)}

    def states(self, job_ids: Collection[int]) -> dict[int, JobProgress]:
        """Each existing job's state, number of attempts, max_pending deadline and why it waits,
        and nothing else: the narrow read the executor makes of every held job at each sync. Whole rows
        (``jobs``) cost about a millisecond each to load, too much for a thousand held tasks
        every second (issue 17's benchmark, ``BENCHMARKS.md``); only the jobs that moved need them."""
        wanted = sorted(set(job_ids))
        store = self.hook.store
        found: dict[int, JobProgress] = {}
        with reachable(str(store.engine.url)), store.sessions() as session:
            for start in range(0, len(wanted), IN_CHUNK):
                query = select(
                    JobRow.id,
                    JobRow.state,
                    JobRow.attempts,
                    JobRow.pending_deadline,
                    JobRow.pending_reason,
                    JobRow.waiting_for,
                    JobRow.position_in_share,
                    JobRow.position_in_queue,
                ).where(JobRow.id.in_(wanted[start : start + IN_CHUNK]))
                found.update((row.id, JobProgress(*row[1:])) for row in session.execute(query))
        return found

    def forecasts(self, job_ids: Collection[int]) -> dict[int, ForecastRow]:
        """The waiting jobs' latest forecasts (``quota_forecasts``), one query."""
        store = self.hook.store
        with reachable(str(store.engine.url)):
            return store.forecasts(job_ids)

    def attempts(self, job_ids: Collection[int]) -> dict[int, OpenAttempt]:
        """Each job's latest attempt, as the quota scheduler last wrote it."""
        store = self.hook.store
        with reachable(str(store.engine.url)), store.sessions() as session:
            return latest_attempts(session, job_ids)

    def reports(self, keys: Collection[tuple[int, int]]) -> dict[tuple[int, int], TaskReport]:
        store = self.hook.store
        with reachable(str(store.engine.url)), store.sessions() as session:
            return read_reports(session, keys)

    def report(self, job_id: int, attempt: int, status: str, reason: str | None, try_number: int) -> None:
        """What became of the attempt's try, for the ``airflow`` backend's poll."""
        store = self.hook.store
        with reachable(str(store.engine.url)), store.sessions() as session, session.begin():
            write_report(session, job_id, attempt, status, time.time(), reason, try_number)

    def refusal(self, job_id: int) -> str:
        """Why a job is gone: the scheduler refused it when it took it in."""
        refused = self.hook.submission_refusal(job_id)
        return f"the quota scheduler refused quota job {job_id}: {refused}" if refused else f"no quota job {job_id}"

    def cancel(self, job_id: int) -> None:
        self.hook.cancel(job_id)
