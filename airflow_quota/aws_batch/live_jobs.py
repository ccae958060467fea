"""The jobs AWS Batch places that have not ended, as the delegating leader holds them between
rounds (``service/delegation.py``), and the rows a look at one of them writes; pure.

``LiveJobs`` is read from the quota database once, when a leader takes over, then kept by the
leader: a submission adds a job, a look that changed it replaces it, an end removes it. A round
then costs what its pages hold, not what the database holds: it keeps each share's use of each
type (the instances its placed jobs hold), which says what a placement borrows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from airflow_quota.aws_batch.service_jobs import Followed, KnownJob
from airflow_quota.core.model import Entry, Failed, JobState, Placed, Preempted, Requeued, Succeeded

DELEGATED_BACKEND = "aws_batch"
"""The backend named on the attempts AWS Batch places (the jobs keep ``sagemaker``: SageMaker
runs their training)."""


class LiveJobs:
    """The live delegated jobs by service job id, with each share's use of each type."""

    def __init__(self, jobs: Iterable[tuple[str, KnownJob, float]] = ()) -> None:
        self._jobs: dict[str, KnownJob] = {}
        self._changed_at: dict[str, float] = {}
        self._use: dict[tuple[str, str], int] = {}
        for service_job_id, job, changed_at in jobs:
            self.put(service_job_id, job, changed_at)

    def __contains__(self, service_job_id: object) -> bool:
        return service_job_id in self._jobs

    def __getitem__(self, service_job_id: str) -> KnownJob:
        return self._jobs[service_job_id]

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[KnownJob]:
        return iter(self._jobs.values())

    def put(self, service_job_id: str, job: KnownJob, changed_at: float) -> None:
        """The job as it now stands (new, or changed at ``changed_at``); an ended one leaves."""
        old = self._jobs.pop(service_job_id, None)
        if old is not None:
            self._count(old, -1)
        if job.state.is_final:
            self._changed_at.pop(service_job_id, None)
            return
        self._jobs[service_job_id] = job
        self._changed_at[service_job_id] = changed_at
        self._count(job, +1)

    def _count(self, job: KnownJob, sign: int) -> None:
        if job.state.holds_capacity and job.entry is not None:
            key = (job.share, job.entry.instance_type)
            self._use[key] = self._use.get(key, 0) + sign * job.entry.count

    def use(self, share: str, instance_type: str) -> int:
        """The instances of ``instance_type`` the share's placed jobs hold."""
        return self._use.get((share, instance_type), 0)

    def shares(self) -> list[str]:
        return sorted({job.share for job in self._jobs.values()})

    def unchanged_since(self, share: str, since: float) -> Iterator[tuple[str, KnownJob]]:
        """The share's jobs not changed since ``since``, by service job id."""
        for service_job_id, job in self._jobs.items():
            if job.share == share and self._changed_at[service_job_id] < since:
                yield service_job_id, job


def after_look(job: KnownJob, followed: Followed) -> KnownJob:
    """The job as a look left it (its new columns)."""
    columns = followed.columns
    entry = job.entry
    if "instance_type" in columns:
        entry = Entry(columns["instance_type"], columns["count"]) if columns["instance_type"] else None
    return dataclasses.replace(
        job,
        state=JobState(columns.get("state", job.state.value)),
        attempts=columns.get("attempts", job.attempts),
        preemptions=columns.get("preemptions", job.preemptions),
        runnable_since=columns.get("runnable_since", job.runnable_since),
        wait_seconds=columns.get("wait_seconds", job.wait_seconds),
        entry=entry,
        borrowed=columns.get("borrowed", job.borrowed),
        running_since=columns.get("running_since", job.running_since),
        detail=columns.get("detail", job.detail),
    )


def attempt_rows(job: KnownJob, followed: Followed) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``quota_attempts`` rows a look writes: one inserted for each placement AWS made, and
    the changes of the ones it ended (preempted, requeued, succeeded, failed) or that began to
    train, by key (job id, number). An attempt is known by the job's count of them: no read."""
    inserted: dict[int, dict[str, Any]] = {}
    changed: dict[int, dict[str, Any]] = {}
    number, open_ = job.attempts, job.state.holds_capacity

    def change(values: dict[str, Any]) -> None:
        (inserted[number] if number in inserted else changed.setdefault(number, {})).update(values)

    for decision in followed.decisions:
        if isinstance(decision, Placed):
            number, open_ = decision.attempt, True
            inserted[number] = {
                "job_id": job.job_id,
                "number": number,
                "backend": DELEGATED_BACKEND,
                "instance_type": decision.entry.instance_type,
                "count": decision.entry.count,
                "training_plan": decision.entry.training_plan,
                "borrowed": decision.borrowed,
                "placed_at": decision.at,
                "action": None,
                "stop_grace": 0.0,
                "status": "PENDING",
                "running_since": None,
                "ended_at": None,
                "reason": None,
                "external_name": None,
                "external_arn": None,
            }
        elif open_ and isinstance(decision, (Preempted, Requeued, Succeeded, Failed)):
            status = {Preempted: "STOPPED", Requeued: "CAPACITY_ERROR", Succeeded: "SUCCEEDED", Failed: "FAILED"}
            reason = getattr(decision, "reason", None)
            detail = decision.detail if isinstance(decision, Failed) else reason
            change({"status": status[type(decision)], "ended_at": decision.at, "reason": detail})
            open_ = False
    running = followed.columns.get("running_since")
    if open_ and (followed.columns.get("state") == JobState.RUNNING.value or running is not None):
        change({"status": "RUNNING", **({"running_since": running} if running is not None else {})})
    arn = followed.training_job_arn
    if open_ and arn is not None:
        # the training job SageMaker runs for it: the task's result, links and logs name it
        change({"external_arn": arn, "external_name": arn.rsplit("/", 1)[-1]})
    updates = [{"job_id": job.job_id, "number": n, **values} for n, values in changed.items()]
    return list(inserted.values()), updates
