"""What a backend's report that is news tells the core (``service/intake.py``, ``take_report``):
only the current attempt of a job the core holds is reported to it; an attempt the backend does
not know ended, as stopped before its start or as failed; a job forgotten is written, not fed."""

from __future__ import annotations

from airflow_quota.core.inputs import AttemptFailed, AttemptRunning, AttemptStopped, AttemptSucceeded
from airflow_quota.core.model import Entry, Job, JobState, Placement
from airflow_quota.service.backends.base import STOPPED_BEFORE_START, AttemptReport, AttemptStatus
from airflow_quota.service.intake import is_news, take_report
from airflow_quota.store.models import Attempt, AttemptState
from tests.builders import request

ENTRY = Entry("ml.g5.xlarge", 1)


def running_job(attempts: int = 1, stopping: bool = False) -> Job:
    job = Job(1, "train", "research", 1, (ENTRY,), request("train"), 0.0, state=JobState.RUNNING)
    job.attempts = attempts
    job.placement = Placement(ENTRY, 0, 5.0)
    job.stopping = stopping
    return job


def attempt(
    number: int = 1, status: AttemptState = AttemptState.STARTING, running_since: float | None = None
) -> Attempt:
    return Attempt(
        job_id=7,
        number=number,
        backend="local",
        instance_type=ENTRY.instance_type,
        count=1,
        training_plan=None,
        borrowed=0,
        placed_at=5.0,
        action=None,
        status=status.value,
        running_since=running_since,
    )


def test_a_training_that_started_is_told_with_its_start() -> None:
    taken = take_report(attempt(), AttemptReport(AttemptStatus.RUNNING, running_since=8.0), running_job(), 10.0, 600)
    assert taken.running_since == 8.0 and taken.ended is None
    assert taken.inputs == (AttemptRunning(7, 1, 8.0),)


def test_a_start_of_a_job_being_stopped_is_written_and_not_told() -> None:
    report = AttemptReport(AttemptStatus.RUNNING)
    taken = take_report(attempt(), report, running_job(stopping=True), 10.0, 600)
    assert taken.running_since == 10.0 and taken.inputs == ()


def test_an_end_is_told_only_for_the_current_attempt() -> None:
    succeeded = AttemptReport(AttemptStatus.SUCCEEDED)
    assert take_report(attempt(1), succeeded, running_job(attempts=1), 10.0, 600).inputs == (AttemptSucceeded(7, 1),)
    old = take_report(attempt(1), succeeded, running_job(attempts=2), 10.0, 600)
    assert old.ended == succeeded and old.inputs == ()


def test_a_stop_is_told_to_a_job_being_stopped() -> None:
    stopped = AttemptReport(AttemptStatus.STOPPED, "Preempted")
    taken = take_report(attempt(), stopped, running_job(stopping=True), 10.0, 600)
    assert taken.inputs == (AttemptStopped(7, 1),)


def test_an_attempt_the_backend_does_not_know_ended() -> None:
    unknown = AttemptReport(AttemptStatus.UNKNOWN)
    never_ran = take_report(attempt(status=AttemptState.NOT_STARTED), unknown, None, 10.0, 600)
    assert never_ran.ended == AttemptReport(AttemptStatus.STOPPED, STOPPED_BEFORE_START) and never_ran.inputs == ()
    lost = take_report(attempt(status=AttemptState.RUNNING, running_since=6.0), unknown, running_job(), 10.0, 600)
    assert lost.ended == AttemptReport(AttemptStatus.FAILED, "BackendLost: no such attempt")
    assert lost.inputs == (AttemptFailed(7, 1, "BackendLost: no such attempt"),)


def test_only_changes_are_news() -> None:
    assert not is_news(attempt(status=AttemptState.RUNNING), AttemptReport(AttemptStatus.RUNNING))
    assert is_news(attempt(status=AttemptState.STARTING), AttemptReport(AttemptStatus.RUNNING))
    assert is_news(attempt(status=AttemptState.RUNNING), AttemptReport(AttemptStatus.UNKNOWN))
    assert not is_news(attempt(status=AttemptState.STARTING), AttemptReport(AttemptStatus.PENDING))
