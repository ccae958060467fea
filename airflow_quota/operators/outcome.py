"""Why a training task failed when its training did not: one line for the task log.

A failed quota job says its reason code; the task log must also say, before the exception,
when the training itself never failed: the job was refused, waited too long, found no
capacity, was preempted too often, was cancelled, or its attempts ended on the platform (the
runner lost, the backend refusing to start it, SageMaker's own errors) rather than in the
training's code. A reader then knows not to look in the training's output for the cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_quota.core.model import FailureReason
from airflow_quota.store.models import AttemptState, JobRow

TRAINING_FAILURES = ("ExitCode:", "AlgorithmError")
"""How an attempt's reason starts when the training's own code failed: the local backend's
exit code, SageMaker's ``AlgorithmError``. Any other reason comes from the platform."""

_NOT_THE_TRAINING = {
    FailureReason.PENDING_TIMEOUT.value: "it waited longer than its max_pending_time to be placed",
    FailureReason.CAPACITY_ERROR.value: "the provider had no capacity for its instance preferences",
    FailureReason.PREEMPTION_LIMIT.value: "it was preempted more times than its preemption_retries allow",
    FailureReason.CANCELLED.value: "it was cancelled",
}


def platform_failure(attempt: Any) -> bool:
    """Whether an attempt ended in failure for a reason outside the training's code."""
    if attempt.status == AttemptState.START_FAILED.value:
        return True
    if attempt.status not in (AttemptState.FAILED.value, AttemptState.CAPACITY_ERROR.value):
        return False
    return not str(attempt.reason or "").startswith(TRAINING_FAILURES)


def outside_the_training(job: JobRow, attempts: Sequence[Any]) -> str | None:
    """The line saying a FAILED job failed outside its training, or None when its training's
    own code failed (the training's output then holds the cause)."""
    reason = job.reason or ""
    why = _NOT_THE_TRAINING.get(reason)
    if why is None and reason == FailureReason.ATTEMPTS_EXHAUSTED.value:
        failed = [a for a in attempts if platform_failure(a) or a.status == AttemptState.FAILED.value]
        if failed and platform_failure(failed[-1]):
            last = failed[-1]
            why = f"its last attempt ({last.number}) ended on the platform, not in the training: {last.reason}"
    if why is None:
        return None
    return f"quota job {job.id} ({job.name}) failed outside its training: {why} ({reason}: {job.detail})"


def unfollowed(job_id: int, message: str) -> str:
    """The line for a job the task could not follow to its end (the trigger's ``error``
    event): refused by the quota scheduler, gone, or its database unreadable."""
    if "refused" in message:
        return f"quota job {job_id} failed outside its training, which never ran: {message}"
    return f"quota job {job_id} could not be followed to its end (its training may still run): {message}"
