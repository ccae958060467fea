"""Jobs placed by AWS Batch: a quota job as a ``SubmitServiceJob`` request, and AWS's service
jobs read back as the quota scheduler's own states and decisions; pure (no I/O).

When the quota scheduler delegates (``service/delegation.py``, docs/aws-batch.md), AWS Batch's
quota management decides which job runs, when, on which entry of its preference list, and which
is preempted; airflow-quota submits, changes priorities, cancels, and mirrors what AWS did into
the quota database, in the same decisions (``core/model.py``) its own core would have written,
so that every reader (the operator's trigger, the sensors, the Quotas page, alerts, metrics)
works unchanged.

The submission (``submit_request``):

- ``serviceRequestPayload`` is the job's CreateTrainingJob request with its preference list as
  ``ResourceConfig.InstancePreferences`` (each entry's type, count and training plan ARN: SageMaker
  takes the first with capacity), its ``max_pending_seconds`` as
  ``StoppingCondition.MaxPendingTimeInSeconds`` and its checkpoint URI as ``CheckpointConfig``;
  checked against botocore's own SageMaker model before any call;
- ``quotaShareName`` its share, ``schedulingPriority`` its priority (higher first, as here);
- ``preemptionConfiguration.preemptionRetriesBeforeTermination`` its ``preemption_retries``;
- ``retryStrategy`` its ``retry_attempts`` and ``retry_on`` (each pattern a RETRY on the status
  reason, then EXIT for any other);
- ``clientToken`` derived from the job's id, name and submission time: a leader that submits
  again after a crash gets the job AWS already has.

The mirror: AWS's statuses (``STATE_OF``) as the quota scheduler's; a service job's summary (a
``ListServiceJobs`` item) or description (``DescribeServiceJob``) as a ``ServiceJob``; and
``follow``, what one look at a job means against what the store holds of it: the decisions to
record (placed, preempted, requeued, succeeded, failed) and the job's new columns.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_quota.core.model import (
    Decision,
    Entry,
    Failed,
    FailureReason,
    JobRequest,
    JobState,
    Placed,
    Preempted,
    PreemptionKind,
    Requeued,
    Succeeded,
)
from airflow_quota.exceptions import InvalidInput, Problem

SERVICE_JOB_TYPE = "SAGEMAKER_TRAINING"
MAX_JOB_NAME = 128
"""SubmitServiceJob's ``jobName``: up to 128 characters."""
MAX_TRAINING_JOB_NAME = 63
MAX_CLIENT_TOKEN = 64
MAX_EVALUATE_ON_EXIT = 5
"""``retryStrategy.evaluateOnExit``: at most 5 entries (AWS Batch user guide)."""
MIN_PENDING_SECONDS, MAX_PENDING_SECONDS = 1800, 2_419_200
"""``StoppingCondition.MaxPendingTimeInSeconds``: 30 minutes to 28 days (SageMaker)."""
PAGE_SIZE = 100
"""``ListServiceJobs.maxResults``: at most 100 a page."""

LIVE_STATUSES = ("RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")
"""The statuses a sweep of a share lists, in the order a job moves through them
(``ShareSweep``): a job's life but its first moments (SUBMITTED and PENDING, which last seconds:
a job the sweep missed in them is described once instead) and its end (a job missing from a whole
sweep is described once, which says how it ended)."""
STATE_OF = {
    "SUBMITTED": JobState.RUNNABLE,
    "PENDING": JobState.RUNNABLE,
    "RUNNABLE": JobState.RUNNABLE,
    "SCHEDULED": JobState.SCHEDULED,
    "STARTING": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
}
"""AWS Batch's service job status as the quota scheduler's job state: waiting in AWS's queue is
RUNNABLE; SCHEDULED (sent to SageMaker) and STARTING (capacity acquired) hold capacity."""
BY_AWS = "AWS Batch"
"""Who preempted a job, when AWS did: its victim order is not published."""
CANCEL_REASON = "Cancelled through airflow-quota"
"""The reason ``TerminateServiceJob`` is given, and how a mirrored FAILED is known as a cancel."""
_PENDING_TIMEOUT = re.compile(r"MaxPendingTime|pending\s+time", re.IGNORECASE)
_CAPACITY = re.compile(r"CAPACITY:|CapacityError|insufficient\s+\w*\s*capacity", re.IGNORECASE)


class DelegationRefused(InvalidInput):
    """A job that AWS Batch cannot be asked to run as it is; the problems name the field and
    the rule. Nothing was called."""


# -- the submission ------------------------------------------------------------------------


def client_token(job_id: int, name: str, submitted_at: float) -> str:
    """The job's idempotency token for SubmitServiceJob (1-64 characters): the same job always
    gets the same one, two jobs never do."""
    digest = hashlib.sha256(f"{job_id}/{name}/{submitted_at!r}".encode()).hexdigest()
    return f"airflow-quota-{job_id}-{digest}"[:MAX_CLIENT_TOKEN]


def service_job_name(job_id: int, name: str) -> str:
    """The service job's name (1-128 letters, digits, hyphens and underscores): the quota job's,
    after its id, so that the AWS console shows which quota job it is."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")
    return f"aq-{job_id}-{safe}"[:MAX_JOB_NAME].rstrip("-")


def training_job_name(job_id: int, name: str) -> str:
    """The CreateTrainingJob name inside the payload (SageMaker's pattern, 63 characters)."""
    safe = re.sub(r"[^a-zA-Z0-9]+", "-", name).strip("-")
    return f"aq-{job_id}-{safe}"[:MAX_TRAINING_JOB_NAME].rstrip("-")


@dataclass(frozen=True)
class DelegatedJob:
    """What a submission to AWS Batch is made of: the stored job's fields."""

    job_id: int
    name: str
    share: str
    priority: int
    request: JobRequest
    training: Mapping[str, Any]
    submitted_at: float
    plan_arns: Mapping[str, str] = field(default_factory=dict)
    """The ARN of each training plan of the configuration, by name."""


def training_payload(job: DelegatedJob) -> dict[str, Any]:
    """The CreateTrainingJob request AWS Batch passes to SageMaker: the job's own, with its
    preference list, pending limit and checkpoint filled in. DelegationRefused names every
    problem: a field the placement fills, a plan without an ARN, a pending limit SageMaker does
    not take, and what botocore's SageMaker model finds."""
    from airflow_quota.service.backends.sagemaker import request_problems

    problems: list[Problem] = []
    payload: dict[str, Any] = copy.deepcopy(dict(job.training))
    payload["TrainingJobName"] = training_job_name(job.job_id, job.name)
    resource = dict(payload.get("ResourceConfig") or {})
    for chosen in ("InstanceType", "InstanceCount", "InstanceGroups", "InstancePreferences", "TrainingPlanArn"):
        if chosen in resource:
            problems.append(
                Problem(
                    f"training.ResourceConfig.{chosen}",
                    "is filled from the job's instance preferences; leave it out of the training request",
                )
            )
    preferences: list[dict[str, Any]] = []
    for index, entry in enumerate(job.request.preferences):
        preference: dict[str, Any] = {"InstanceType": entry.instance_type, "InstanceCount": entry.count}
        if entry.training_plan is not None:
            arn = job.plan_arns.get(entry.training_plan)
            if not arn:
                problems.append(
                    Problem(
                        f"preferences[{index}].training_plan",
                        f"plan {entry.training_plan!r} has no arn in the configuration; AWS Batch needs it",
                    )
                )
            else:
                preference["TrainingPlanArns"] = [arn]
        preferences.append(preference)
    resource["InstancePreferences"] = preferences
    payload["ResourceConfig"] = resource
    if job.request.max_pending_seconds is not None:
        pending = int(job.request.max_pending_seconds)
        if not MIN_PENDING_SECONDS <= pending <= MAX_PENDING_SECONDS:
            problems.append(
                Problem(
                    "max_pending_seconds",
                    f"{pending} is outside SageMaker's {MIN_PENDING_SECONDS}-{MAX_PENDING_SECONDS}"
                    " (MaxPendingTimeInSeconds)",
                )
            )
        payload["StoppingCondition"] = {**(payload.get("StoppingCondition") or {}), "MaxPendingTimeInSeconds": pending}
    if job.request.checkpoint_uri is not None:
        payload["CheckpointConfig"] = {**(payload.get("CheckpointConfig") or {}), "S3Uri": job.request.checkpoint_uri}
    if not problems:
        problems += [Problem("training", line) for line in request_problems(payload)]
    if problems:
        raise DelegationRefused(problems)
    return payload


def retry_strategy(request: JobRequest) -> dict[str, Any]:
    """``retryStrategy``: the job's attempts, and each ``retry_on`` pattern a RETRY on the
    status reason followed by an EXIT on any other (AWS's rule without a match is to retry)."""
    strategy: dict[str, Any] = {"attempts": request.retry_attempts}
    if request.retry_on:
        if len(request.retry_on) + 1 > MAX_EVALUATE_ON_EXIT:
            raise DelegationRefused(
                [
                    Problem(
                        "retry_on",
                        f"{len(request.retry_on)} patterns; AWS Batch takes at most"
                        f" {MAX_EVALUATE_ON_EXIT - 1} (and one EXIT for the rest)",
                    )
                ]
            )
        strategy["evaluateOnExit"] = [
            *({"action": "RETRY", "onStatusReason": pattern} for pattern in request.retry_on),
            {"action": "EXIT", "onStatusReason": "*"},
        ]
    return strategy


def submit_request(job: DelegatedJob, job_queue: str) -> dict[str, Any]:
    """The SubmitServiceJob request of ``job`` on ``job_queue`` (see the module docstring)."""
    request: dict[str, Any] = {
        "jobName": service_job_name(job.job_id, job.name),
        "jobQueue": job_queue,
        "serviceJobType": SERVICE_JOB_TYPE,
        "serviceRequestPayload": json.dumps(training_payload(job), sort_keys=True),
        "quotaShareName": job.share,
        "schedulingPriority": job.priority,
        "retryStrategy": retry_strategy(job.request),
        "clientToken": client_token(job.job_id, job.name, job.submitted_at),
        "tags": {"airflow-quota:job-id": str(job.job_id), "airflow-quota:share": job.share[:256]},
    }
    if job.request.preemption_retries is not None:
        request["preemptionConfiguration"] = {"preemptionRetriesBeforeTermination": job.request.preemption_retries}
    return request


# -- the mirror ----------------------------------------------------------------------------


def _seconds(value: Any) -> float | None:
    """AWS Batch's times are milliseconds since the epoch."""
    return None if value is None else float(value) / 1000.0


@dataclass(frozen=True)
class ServiceJob:
    """One look at a service job: a ``ListServiceJobs`` summary or a ``DescribeServiceJob``."""

    job_id: str
    status: str
    reason: str | None = None
    capacity: tuple[tuple[str, int], ...] = ()
    """What it holds or asks for: (instance type, count) as ``capacityUsage`` says."""
    scheduled_at: float | None = None
    started_at: float | None = None
    stopped_at: float | None = None
    terminated: bool = False
    training_job_arn: str | None = None
    preemptions: int | None = None
    """``preemptionSummary.preemptedAttemptCount`` (0 when absent from a description); None from a
    summary, which does not say."""
    preempted: tuple[tuple[float | None, float | None, str | None], ...] = ()
    """The recent preempted attempts AWS keeps: (started, stopped, status reason)."""

    @property
    def state(self) -> JobState:
        return STATE_OF.get(self.status, JobState.RUNNABLE)

    @property
    def entry(self) -> Entry | None:
        """The entry it runs on (its first capacity unit), when AWS says."""
        if not self.capacity:
            return None
        instance_type, count = self.capacity[0]
        return Entry(instance_type, count)


def service_job(item: Mapping[str, Any]) -> ServiceJob:
    """A summary or a description as a ``ServiceJob``."""
    capacity = tuple(
        (str(usage["capacityUnit"]), round(float(usage.get("quantity", 0))))
        for usage in item.get("capacityUsage") or ()
        if usage.get("capacityUnit")
    )
    latest = (item.get("latestAttempt") or {}).get("serviceResourceId") or {}
    summary = item.get("preemptionSummary")
    preemptions: int | None = None
    preempted: tuple[tuple[float | None, float | None, str | None], ...] = ()
    if "startedAt" in item and "jobQueue" in item:  # a description: no summary means none
        preemptions = int((summary or {}).get("preemptedAttemptCount", 0))
        preempted = tuple(
            (_seconds(a.get("startedAt")), _seconds(a.get("stoppedAt")), a.get("statusReason"))
            for a in (summary or {}).get("recentPreemptedAttempts") or ()
        )
    started = item.get("startedAt")
    return ServiceJob(
        job_id=str(item["jobId"]),
        status=str(item.get("status", "SUBMITTED")),
        reason=item.get("statusReason"),
        capacity=capacity,
        scheduled_at=_seconds(item.get("scheduledAt")),
        started_at=_seconds(started) if started else None,
        stopped_at=_seconds(item.get("stoppedAt")),
        terminated=bool(item.get("isTerminated", False)),
        training_job_arn=latest.get("value"),
        preemptions=preemptions,
        preempted=preempted,
    )


@dataclass(frozen=True)
class KnownJob:
    """What the quota database holds of a delegated job (its row), for ``follow``."""

    job_id: int
    name: str
    share: str
    state: JobState
    attempts: int
    preemptions: int
    runnable_since: float | None
    wait_seconds: float
    entry: Entry | None = None
    borrowed: int = 0
    running_since: float | None = None
    preemption_retries: int | None = None
    cancel_asked: bool = False
    detail: str | None = None
    """What AWS last said of it (its status reason), as stored."""
    checkpoint_interval: float | None = None
    """Seconds of work between its checkpoints: what a preemption loses (docs/model.md rule 6.2)."""
    types: tuple[str, ...] = ()
    """The instance types of its preference list."""


@dataclass
class Followed:
    """What one look means: the decisions to record, in order, and the job's new columns."""

    decisions: list[Decision] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)
    preemptions: list[tuple[int, Preempted]] = field(default_factory=list)
    """Each preemption with the attempt it ended."""
    training_job_arn: str | None = None
    """The SageMaker training job AWS's latest attempt runs, when it says."""
    needs_description: bool = False
    """The look cannot tell what happened (a summary of a job back in the queue after holding
    capacity: preempted, or requeued for want of capacity?): describe it."""


def follow(known: KnownJob, seen: ServiceJob, now: float, borrowed: int = 0, queue: str = "") -> Followed:
    """What a look at a delegated job means against what the store holds of it. ``borrowed``:
    instances above its share's limit if this look places it (the caller counts the share's
    holding jobs). A summary that cannot tell a preemption from a requeue asks for a description
    (``needs_description``) and changes nothing."""
    out = Followed(training_job_arn=seen.training_job_arn)
    state = seen.state
    preempted_since = seen.preemptions is not None and seen.preemptions > known.preemptions
    if state is JobState.RUNNABLE and known.state.holds_capacity and seen.preemptions is None:
        out.needs_description = True
        return out
    attempts, holding = known.attempts, known.state.holds_capacity
    columns = out.columns
    if preempted_since:
        assert seen.preemptions is not None
        recent = list(seen.preempted)[-(seen.preemptions - known.preemptions) :]
        for index in range(seen.preemptions - known.preemptions):
            started, stopped, reason = recent[index] if index < len(recent) else (None, None, None)
            if not holding:  # preempted and placed again between two looks: its placement first
                attempts += 1
                out.decisions.append(_placed(known, seen, attempts, started or now, 0, queue))
            ran = max(0.0, (stopped or now) - (started or known.running_since or now))
            lost_seconds = ran % known.checkpoint_interval if known.checkpoint_interval else ran
            kind = PreemptionKind.CROSS_SHARE if known.borrowed > 0 else PreemptionKind.IN_SHARE
            why = reason or "AWS Batch took its capacity back (its victim order is not published)"
            preempted = Preempted(stopped or now, known.name, known.share, kind, BY_AWS, lost_seconds, 0.0, why)
            out.decisions.append(preempted)
            out.preemptions.append((attempts, preempted))
            holding = False
        columns["preemptions"] = seen.preemptions
        columns["runnable_since"] = seen.preempted[-1][1] if seen.preempted and seen.preempted[-1][1] else now
    if state is JobState.RUNNABLE:
        if holding:  # back in the queue with no preemption counted: SageMaker had no capacity
            out.decisions.append(Requeued(now, known.name, known.share, seen.reason or "AWS Batch requeued it"))
            columns["runnable_since"] = now
        if holding or preempted_since:
            columns.update(state=JobState.RUNNABLE.value, borrowed=0, instance_type=None, count=None)
        if holding or preempted_since or seen.reason != known.detail:
            columns["pending_reason"] = _pending_reason(seen.reason)
            columns["detail"] = seen.reason
    elif state.holds_capacity:
        if not holding:
            attempts += 1
            at = seen.scheduled_at or now
            out.decisions.append(_placed(known, seen, attempts, at, borrowed, queue))
            since = columns.get("runnable_since", known.runnable_since)
            columns["wait_seconds"] = known.wait_seconds + max(0.0, at - (since if since is not None else at))
            entry = seen.entry
            columns.update(
                instance_type=entry.instance_type if entry else None,
                count=entry.count if entry else None,
                borrowed=borrowed,
                runnable_since=None,
                pending_reason=None,
            )
        if state is not known.state or not holding:
            columns["state"] = state.value
        if state is JobState.RUNNING and seen.started_at is not None:
            columns["running_since"] = seen.started_at
    elif state is JobState.SUCCEEDED:
        if not holding:
            attempts += 1
            out.decisions.append(_placed(known, seen, attempts, seen.scheduled_at or now, borrowed, queue))
        out.decisions.append(Succeeded(seen.stopped_at or now, known.name, known.share))
        columns.update(state=state.value, reason=None, runnable_since=None, pending_reason=None)
    else:
        reason = failure_reason(known, seen)
        detail = seen.reason or "AWS Batch ended it"
        out.decisions.append(Failed(seen.stopped_at or now, known.name, known.share, reason, detail))
        columns.update(state=state.value, reason=reason.value, detail=detail, runnable_since=None, pending_reason=None)
    if attempts != known.attempts:
        columns["attempts"] = attempts
    return out


def failure_reason(known: KnownJob, seen: ServiceJob) -> FailureReason:
    """The one reason code of a service job AWS ended in failure."""
    text = seen.reason or ""
    if known.cancel_asked or CANCEL_REASON in text:
        return FailureReason.CANCELLED
    if known.preemption_retries is not None and (seen.preemptions or 0) > known.preemption_retries:
        return FailureReason.PREEMPTION_LIMIT
    if _PENDING_TIMEOUT.search(text):
        return FailureReason.PENDING_TIMEOUT
    if _CAPACITY.search(text) or text.startswith("MISCONFIGURATION:"):
        return FailureReason.CAPACITY_ERROR
    return FailureReason.ATTEMPTS_EXHAUSTED


def _pending_reason(reason: str | None) -> str | None:
    """A waiting job's pending reason, from AWS's status reason: AWS's code (``MISCONFIGURATION``,
    ``CAPACITY``) when it gives one, else ``AWS_BATCH_QUEUE``."""
    if reason and ":" in reason.split(" ", 1)[0]:
        return reason.split(":", 1)[0][:40]
    return "AWS_BATCH_QUEUE"


def _placed(known: KnownJob, seen: ServiceJob, attempt: int, at: float, borrowed: int, queue: str) -> Placed:
    entry = seen.entry or known.entry or Entry("unknown", 0)
    where = f" (job queue {queue})" if queue else ""
    return Placed(at, known.name, known.share, entry, borrowed, attempt, f"placed by AWS Batch{where}")


def borrowed_by(limit: int, holding: Sequence[int], count: int) -> int:
    """Instances above its share's ``limit`` a job of ``count`` instances borrows when it joins
    the share's ``holding`` jobs of its type (their counts)."""
    return max(0, min(count, sum(holding) + count - limit))


# -- the sweep ------------------------------------------------------------------------------


@dataclass
class ShareSweep:
    """One share's walk through the live statuses, one ``ListServiceJobs`` page a round, so a
    round costs one call per share whatever the number of jobs. A job the store holds as live
    that a whole sweep did not list (and that was submitted before the sweep began) has ended or
    moved back behind the sweep: the caller describes it once."""

    share: str
    began: float
    status: int = 0
    token: str | None = None
    seen: dict[str, ServiceJob] = field(default_factory=dict)

    def request(self, job_queue: str) -> dict[str, Any]:
        """The next page's ListServiceJobs request (QUOTA_SHARE_NAME combines with a status)."""
        params: dict[str, Any] = {
            "jobQueue": job_queue,
            "jobStatus": LIVE_STATUSES[self.status],
            "maxResults": PAGE_SIZE,
            "filters": [{"name": "QUOTA_SHARE_NAME", "values": [self.share]}],
        }
        if self.token:
            params["nextToken"] = self.token
        return params

    def take(self, answer: Mapping[str, Any]) -> list[ServiceJob]:
        """The page's jobs, noted as seen; the sweep moves to the next page or status."""
        jobs = [service_job(item) for item in answer.get("jobSummaryList") or ()]
        for job in jobs:
            self.seen[job.job_id] = job
        self.token = answer.get("nextToken") or None
        if self.token is None:
            self.status += 1
        return jobs

    @property
    def complete(self) -> bool:
        return self.status >= len(LIVE_STATUSES)
