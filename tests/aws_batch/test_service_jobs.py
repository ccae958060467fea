"""A quota job as a SubmitServiceJob request, and AWS's service jobs read back as the quota
scheduler's states and decisions (``aws_batch/service_jobs.py``): pure, no calls. The request is
checked against botocore's own Batch model, its payload against SageMaker's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator

from airflow_quota.aws_batch.service_jobs import (
    LIVE_STATUSES,
    DelegatedJob,
    DelegationRefused,
    KnownJob,
    ShareSweep,
    borrowed_by,
    client_token,
    follow,
    service_job,
    submit_request,
)
from airflow_quota.core.model import (
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
from tests.aws_batch.aws import TRAINING

G5, P4 = "ml.g5.xlarge", "ml.p4d.24xlarge"
PLAN_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/team-a-p4"


def job(**request: Any) -> DelegatedJob:
    fields: dict[str, Any] = {
        "name": "llm-finetune",
        "share": "team-a",
        "priority": 7,
        "preferences": [
            {"instance_type": P4, "count": 2, "training_plan": "p4-plan"},
            {"instance_type": G5, "count": 8},
        ],
        **request,
    }
    training = fields.pop("training", TRAINING)
    return DelegatedJob(
        41, fields["name"], fields["share"], fields["priority"], JobRequest.model_validate(fields), training,
        1_765_000_000.5, {"p4-plan": PLAN_ARN},
    )  # fmt: skip


def batch_model_problems(operation: str, params: dict[str, Any]) -> str:
    shape = get_session().get_service_model("batch").operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    return report.generate_report() if report.has_errors() else ""


def test_a_job_becomes_a_submit_service_job_request_botocore_accepts() -> None:
    request = submit_request(
        job(preemption_retries=3, retry_attempts=3, retry_on=["*InternalServerError*"], max_pending_seconds=7200,
            checkpoint_uri="s3://team-a/ckpt/llm"),
        "quota-queue",
    )  # fmt: skip
    assert batch_model_problems("SubmitServiceJob", request) == ""
    payload = json.loads(request.pop("serviceRequestPayload"))
    assert request == {
        "jobName": "aq-41-llm-finetune",
        "jobQueue": "quota-queue",
        "serviceJobType": "SAGEMAKER_TRAINING",
        "quotaShareName": "team-a",
        "schedulingPriority": 7,
        "preemptionConfiguration": {"preemptionRetriesBeforeTermination": 3},
        "retryStrategy": {
            "attempts": 3,
            "evaluateOnExit": [
                {"action": "RETRY", "onStatusReason": "*InternalServerError*"},
                {"action": "EXIT", "onStatusReason": "*"},
            ],
        },
        "clientToken": client_token(41, "llm-finetune", 1_765_000_000.5),
        "tags": {"airflow-quota:job-id": "41", "airflow-quota:share": "team-a"},
    }
    assert payload["ResourceConfig"] == {
        "VolumeSizeInGB": 50,
        "InstancePreferences": [
            {"InstanceType": P4, "InstanceCount": 2, "TrainingPlanArns": [PLAN_ARN]},
            {"InstanceType": G5, "InstanceCount": 8},
        ],
    }
    assert payload["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxPendingTimeInSeconds": 7200}
    assert payload["CheckpointConfig"] == {"S3Uri": "s3://team-a/ckpt/llm"}
    assert payload["TrainingJobName"] == "aq-41-llm-finetune"


def test_without_preemption_retries_aws_requeues_without_limit() -> None:
    request = submit_request(job(), "quota-queue")
    assert "preemptionConfiguration" not in request
    assert request["retryStrategy"] == {"attempts": 1}


def test_the_client_token_is_the_jobs_own_and_fits_aws() -> None:
    token = client_token(41, "x" * 128, 1.0)
    assert token == client_token(41, "x" * 128, 1.0)
    assert token != client_token(42, "x" * 128, 1.0)
    assert 1 <= len(token) <= 64


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        pytest.param(
            {"training": {**TRAINING, "ResourceConfig": {"InstanceType": G5, "VolumeSizeInGB": 1}}},
            "training.ResourceConfig.InstanceType: is filled from the job's instance preferences",
            id="an instance type in the request",
        ),
        pytest.param(
            {"max_pending_seconds": 600},
            "max_pending_seconds: 600 is outside SageMaker's 1800-2419200",
            id="a pending limit SageMaker does not take",
        ),
        pytest.param(
            {"preferences": [{"instance_type": P4, "count": 1, "training_plan": "unknown-plan"}]},
            "preferences[0].training_plan: plan 'unknown-plan' has no arn",
            id="a plan without an ARN",
        ),
        pytest.param(
            {"training": {k: v for k, v in TRAINING.items() if k != "RoleArn"}},
            'training: Missing required parameter in input: "RoleArn"',
            id="a request SageMaker's model refuses",
        ),
        pytest.param(
            {"retry_on": ["a*", "b*", "c*", "d*", "e*"]},
            "retry_on: 5 patterns; AWS Batch takes at most 4",
            id="more retry patterns than evaluateOnExit holds",
        ),
    ],
)
def test_what_aws_batch_cannot_take_is_refused_naming_the_field(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(DelegationRefused) as refused:
        submit_request(job(**changes), "quota-queue")
    assert named in str(refused.value)


def summary(job_id: str, status: str, **fields: Any) -> dict[str, Any]:
    return {"jobId": job_id, "jobName": job_id, "serviceJobType": "SAGEMAKER_TRAINING", "status": status, **fields}


def description(job_id: str, status: str, **fields: Any) -> dict[str, Any]:
    return {**summary(job_id, status), "jobQueue": "quota-queue", "startedAt": 0, **fields}


def known(state: JobState = JobState.RUNNABLE, **fields: Any) -> KnownJob:
    values: dict[str, Any] = {
        "job_id": 7, "name": "j", "share": "qs1", "state": state, "attempts": 0, "preemptions": 0,
        "runnable_since": 100.0, "wait_seconds": 0.0, **fields,
    }  # fmt: skip
    return KnownJob(**values)


def test_aws_timestamps_are_milliseconds_and_capacity_is_the_entry() -> None:
    seen = service_job(
        summary(
            "a",
            "RUNNING",
            capacityUsage=[{"capacityUnit": G5, "quantity": 2.0}],
            scheduledAt=160_000,
            startedAt=170_000,
        )
    )
    assert (seen.state, seen.entry, seen.scheduled_at, seen.started_at) == (
        JobState.RUNNING,
        Entry(G5, 2),
        160.0,
        170.0,
    )
    assert seen.preemptions is None  # a summary does not say
    assert service_job(description("a", "RUNNING")).preemptions == 0


@pytest.mark.parametrize(
    ("status", "state"),
    [("SUBMITTED", "RUNNABLE"), ("PENDING", "RUNNABLE"), ("RUNNABLE", "RUNNABLE"), ("SCHEDULED", "SCHEDULED"),
     ("STARTING", "STARTING"), ("RUNNING", "RUNNING"), ("SUCCEEDED", "SUCCEEDED"), ("FAILED", "FAILED")],
)  # fmt: skip
def test_each_aws_status_is_one_state(status: str, state: str) -> None:
    assert service_job(summary("a", status)).state is JobState(state)


def test_a_job_aws_scheduled_is_placed_on_its_entry_after_its_wait() -> None:
    seen = service_job(
        summary("a", "SCHEDULED", capacityUsage=[{"capacityUnit": G5, "quantity": 2}], scheduledAt=400_000)
    )
    followed = follow(known(), seen, now=500.0, borrowed=1, queue="q")
    placed = followed.decisions[0]
    assert isinstance(placed, Placed)
    assert (placed.at, placed.entry, placed.borrowed, placed.attempt) == (400.0, Entry(G5, 2), 1, 1)
    assert "placed by AWS Batch (job queue q)" in placed.reason
    assert followed.columns["wait_seconds"] == 300.0
    assert followed.columns["state"] == "SCHEDULED"


def test_a_waiting_job_still_waiting_changes_nothing() -> None:
    followed = follow(known(detail=None), service_job(summary("a", "RUNNABLE")), now=500.0)
    assert (followed.decisions, followed.columns) == ([], {})


def test_a_holding_job_back_in_the_queue_asks_for_its_description() -> None:
    followed = follow(
        known(JobState.RUNNING, attempts=1, entry=Entry(G5, 1)), service_job(summary("a", "RUNNABLE")), 500.0
    )
    assert followed.needs_description
    assert (followed.decisions, followed.columns) == ([], {})


def test_a_preemption_counted_by_aws_is_a_preemption_of_the_borrowed_job_across_shares() -> None:
    seen = service_job(
        description(
            "a", "RUNNABLE",
            preemptionSummary={"preemptedAttemptCount": 1, "recentPreemptedAttempts": [
                {"startedAt": 200_000, "stoppedAt": 450_000, "statusReason": "preempted for qs2"}]},
        )
    )  # fmt: skip
    followed = follow(known(JobState.RUNNING, attempts=1, entry=Entry(G5, 1), borrowed=1), seen, now=500.0)
    [preempted] = followed.decisions
    assert isinstance(preempted, Preempted)
    assert (preempted.kind, preempted.by, preempted.lost_seconds, preempted.at) == (
        PreemptionKind.CROSS_SHARE, "AWS Batch", 250.0, 450.0
    )  # fmt: skip
    assert followed.columns["state"] == "RUNNABLE" and followed.columns["preemptions"] == 1
    assert followed.columns["runnable_since"] == 450.0
    assert followed.preemptions == [(1, preempted)]


def test_a_job_on_its_own_limit_preempted_is_an_in_share_preemption() -> None:
    seen = service_job(description("a", "RUNNABLE", preemptionSummary={"preemptedAttemptCount": 1}))
    followed = follow(known(JobState.RUNNING, attempts=1, entry=Entry(G5, 1), borrowed=0), seen, now=500.0)
    assert [d.kind for d in followed.decisions if isinstance(d, Preempted)] == [PreemptionKind.IN_SHARE]


def test_back_in_the_queue_without_a_preemption_is_a_requeue_for_capacity() -> None:
    seen = service_job(description("a", "RUNNABLE", statusReason="CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - no"))
    followed = follow(known(JobState.SCHEDULED, attempts=1, entry=Entry(G5, 1)), seen, now=500.0)
    assert [type(d) for d in followed.decisions] == [Requeued]
    assert followed.columns["pending_reason"] == "CAPACITY"


def test_preempted_and_placed_again_between_two_looks_is_both() -> None:
    seen = service_job(
        description("a", "RUNNING", capacityUsage=[{"capacityUnit": G5, "quantity": 1}], scheduledAt=480_000,
                    preemptionSummary={"preemptedAttemptCount": 1, "recentPreemptedAttempts": [{"stoppedAt": 450_000}]})
    )  # fmt: skip
    followed = follow(known(JobState.RUNNING, attempts=1, entry=Entry(G5, 1)), seen, now=500.0)
    assert [type(d) for d in followed.decisions] == [Preempted, Placed]
    assert followed.columns["attempts"] == 2
    assert followed.columns["wait_seconds"] == 30.0  # from the preemption to the new placement


def test_a_job_that_ended_unseen_is_placed_then_ended() -> None:
    followed = follow(known(), service_job(description("a", "SUCCEEDED", stoppedAt=900_000)), now=950.0)
    assert [type(d) for d in followed.decisions] == [Placed, Succeeded]
    assert followed.decisions[-1].at == 900.0


@pytest.mark.parametrize(
    ("reason", "fields", "expected"),
    [
        ("Terminated: Cancelled through airflow-quota", {}, FailureReason.CANCELLED),
        ("anything", {"cancel_asked": True}, FailureReason.CANCELLED),
        ("Received status from SageMaker: MaxPendingTimeInSeconds exceeded", {}, FailureReason.PENDING_TIMEOUT),
        ("MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - too big", {}, FailureReason.CAPACITY_ERROR),
        ("Essential container exited", {}, FailureReason.ATTEMPTS_EXHAUSTED),
    ],
)
def test_a_failure_carries_its_one_reason(reason: str, fields: dict[str, Any], expected: FailureReason) -> None:
    followed = follow(
        known(JobState.RUNNING, attempts=1, **fields), service_job(description("a", "FAILED", statusReason=reason)), 1.0
    )
    [failed] = followed.decisions
    assert isinstance(failed, Failed)
    assert (failed.reason, failed.detail) == (expected, reason)


def test_preemptions_past_the_jobs_retries_are_its_preemption_limit() -> None:
    seen = service_job(description("a", "FAILED", preemptionSummary={"preemptedAttemptCount": 2}))
    followed = follow(known(JobState.RUNNING, attempts=2, preemptions=1, preemption_retries=1), seen, 1.0)
    assert followed.decisions[-1].reason is FailureReason.PREEMPTION_LIMIT  # type: ignore[attr-defined]


def test_borrowing_is_what_the_share_holds_past_its_limit() -> None:
    assert borrowed_by(limit=2, holding=[1], count=1) == 0
    assert borrowed_by(limit=2, holding=[2], count=3) == 3
    assert borrowed_by(limit=2, holding=[1, 1], count=2) == 2
    assert borrowed_by(limit=4, holding=[3], count=2) == 1


def test_a_sweep_lists_each_live_status_of_its_share_page_by_page() -> None:
    sweep = ShareSweep("qs1", began=0.0)
    asked = []
    while not sweep.complete:
        request = sweep.request("quota-queue")
        assert batch_model_problems("ListServiceJobs", request) == ""
        asked.append((request["jobStatus"], request.get("nextToken")))
        token = "t2" if request["jobStatus"] == "RUNNING" and "nextToken" not in request else None
        sweep.take(
            {"jobSummaryList": [summary(f"{request['jobStatus']}-{token}", request["jobStatus"])], "nextToken": token}
        )
    assert asked == [(s, None) for s in LIVE_STATUSES] + [("RUNNING", "t2")]
    assert request["filters"] == [{"name": "QUOTA_SHARE_NAME", "values": ["qs1"]}]
    assert len(sweep.seen) == 5
