"""What the leader takes in, as the core's inputs: the requests of the inbox (submissions,
priority changes, cancels, configuration versions) and the backends' reports on attempts.

Plain functions of the rows and reports read: which requests a step reads (``INBOX``), the
input a request becomes (``request_payload``), the order one instant's reports are taken in
(``report_order``), which reports are news (``is_news``), and what a report that is news tells
the core (``take_report``). ``QuotaService`` reads the rows and feeds the inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from airflow_quota.core.cycle import finished_refusal
from airflow_quota.core.inputs import (
    AttemptFailed,
    AttemptRunning,
    AttemptStopped,
    AttemptSucceeded,
    CapacityErrorReported,
    Input,
)
from airflow_quota.core.model import Job, JobState, Rejected
from airflow_quota.service.backends.base import STOPPED_BEFORE_START, AttemptReport, AttemptStatus
from airflow_quota.service.polling import Known
from airflow_quota.store.models import Attempt, AttemptState, JobRow, Request

REQUESTS_PER_STEP = 100
"""The most requests one step takes in: each step's transaction stays short, so a leader makes
progress through a burst of submissions even when it lives only seconds (the soak kills it every
1 to 4 s), and the lease is renewed between batches."""
INBOX = (
    select(Request, JobRow)
    .outerjoin(JobRow, JobRow.id == Request.job_id)
    .where(Request.handled.is_(False))
    .order_by(Request.id)
    .limit(REQUESTS_PER_STEP)
)
"""The requests not taken in yet, oldest first, each with its job's row: built once."""

_REPORT_ORDER = {
    AttemptStatus.PENDING: 0,
    AttemptStatus.RUNNING: 0,
    AttemptStatus.SUCCEEDED: 1,
    AttemptStatus.FAILED: 2,
    AttemptStatus.CAPACITY_ERROR: 2,
    AttemptStatus.STOPPED: 3,
}
"""The order the simulator plays one instant's happenings in (sim/simulator.py): trainings that
started, then finishes, then failures, then stops; each kind in the order of placement."""


# -- requests -------------------------------------------------------------------------------


def request_payload(
    request: Request, jobs: Mapping[int, JobRow | None], documents: Mapping[int, Any]
) -> dict[str, Any]:
    """The input's payload a request becomes (``service.inputs.from_row`` reads it): a
    configuration's document, a submission's stored request, or the request's own payload."""
    if request.kind == "config":
        return {"document": documents[request.id], "version": request.payload["version"]}
    if request.kind == "submit":
        assert request.job_id is not None
        row = jobs[request.job_id]
        assert row is not None
        return {"job_id": row.id, "request": row.request}
    return {"job_id": request.job_id, **request.payload}


def refusal_of_forgotten(request: Request, row: JobRow | None, now: float) -> Rejected:
    """A change to a job the core has forgotten is refused as the core refuses a change to a
    finished job it holds (its row says what it was; retention may have pruned even that)."""
    if row is None:
        return Rejected(now, str(request.job_id), "", f"job {request.job_id} is finished", request=request.kind)
    error = finished_refusal(row.name, JobState(row.state), request.kind)
    return Rejected(now, row.name, row.share, str(error), request=request.kind)


# -- reports --------------------------------------------------------------------------------


def report_order(placement_order: Mapping[int, int]) -> Callable[[tuple[Attempt, AttemptReport]], tuple[Any, ...]]:
    """The sort key of one instant's (attempt, report) pairs: the simulator's order of kinds
    (``_REPORT_ORDER``), then the order the attempts were placed in."""

    def key(pair: tuple[Attempt, AttemptReport]) -> tuple[Any, ...]:
        attempt, report = pair
        return (
            _REPORT_ORDER.get(report.status, len(_REPORT_ORDER)),
            attempt.placed_at,
            placement_order.get(attempt.job_id, 0),
            attempt.job_id,
            attempt.number,
        )

    return key


def is_news(attempt: Attempt, report: AttemptReport) -> bool:
    """Whether ``report`` changes anything (``take_report`` takes only these): an end, a
    backend that does not know the attempt, or a training that started since the attempt was
    marked running. The rest (still running, still starting) is skipped before the instant's sort."""
    status = report.status
    if status.ended or status is AttemptStatus.UNKNOWN:
        return True
    return status is AttemptStatus.RUNNING and attempt.status != AttemptState.RUNNING.value


def known_of(attempt: Attempt) -> Known | None:
    """What the log holds of a started attempt for a poller that lists its backend's changes:
    RUNNING or PENDING since it was placed (a job's changes all come after its placement). None
    for an attempt whose next poll must report it whatever the listing says (a start refused, one
    never started, one stopped before it ran: the backend may have no job to list)."""
    running = attempt.status == AttemptState.RUNNING.value or (
        attempt.status == AttemptState.STOPPING.value and attempt.running_since is not None
    )
    if running:
        return Known(AttemptStatus.RUNNING, attempt.placed_at)
    if attempt.status == AttemptState.PENDING.value:
        return Known(AttemptStatus.PENDING, attempt.placed_at)
    return None


@dataclass(frozen=True)
class ReportTaken:
    """What a report that is news means: for the attempt's row and for the core."""

    running_since: float | None = None
    """The training started then (news: the attempt was not marked running yet)."""
    ended: AttemptReport | None = None
    """How the attempt ended (a backend that does not know it settled as stopped or failed)."""
    inputs: tuple[Input, ...] = ()
    """What the core is told: only about the job's current attempt, never about an old one."""


def take_report(
    attempt: Attempt, report: AttemptReport, job: Job | None, now: float, capacity_backoff_seconds: float
) -> ReportTaken:
    """What a report that is news (``is_news``) on ``attempt`` of ``job`` (None: a job the core
    no longer holds) means. An attempt the backend does not know ended: stopped before it
    started when it never ran, else failed (refused at its start, or lost by the backend)."""
    current = job is not None and job.attempts == attempt.number and job.placement is not None
    ref, number = attempt.job_id, attempt.number
    if report.status is AttemptStatus.RUNNING:
        since = now if report.running_since is None else min(report.running_since, now)
        started = current and job is not None and not job.stopping
        return ReportTaken(since, inputs=(AttemptRunning(ref, number, since),) if started else ())
    never_ran = attempt.status == AttemptState.NOT_STARTED.value or (
        attempt.status == AttemptState.STOPPING.value and attempt.running_since is None
    )  # STOPPING: stopped while its start was in flight, and the start came too late or failed
    if report.status is AttemptStatus.UNKNOWN and never_ran:
        report = AttemptReport(AttemptStatus.STOPPED, STOPPED_BEFORE_START)
    elif report.status is AttemptStatus.UNKNOWN:
        refused = attempt.status == AttemptState.START_FAILED.value
        reason = attempt.reason if refused else "BackendLost: no such attempt"
        report = AttemptReport(AttemptStatus.FAILED, reason)
    if not report.status.ended:
        return ReportTaken()
    if job is None:
        return ReportTaken(ended=report)
    told: Input | None = None
    if job.stopping and job.attempts == number:
        told = AttemptStopped(ref, number)
    elif current and job.state.holds_capacity:
        if report.status is AttemptStatus.SUCCEEDED:
            told = AttemptSucceeded(ref, number)
        elif report.status is AttemptStatus.CAPACITY_ERROR:
            told = CapacityErrorReported(ref, number, capacity_backoff_seconds)
        else:
            told = AttemptFailed(ref, number, report.reason or report.status.value)
    return ReportTaken(ended=report, inputs=() if told is None else (told,))
