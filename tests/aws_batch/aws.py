"""AWS Batch as the tests of ``aws-batch plan | apply | import`` see it: a real botocore Batch
client that never reaches the network, answered by botocore's ``Stubber``, which checks each
request against ``expected_params`` and both the request and the answer against botocore's
own model (so a field AWS does not have, or a missing required one, fails the test).

A helper module, not a test module: test modules import it, never each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import boto3
from botocore.stub import Stubber

from airflow_quota.aws_batch.policy import JobQueueState, quota_share
from airflow_quota.core.config import QuotaConfig

REGION = "us-east-1"
ACCOUNT = "123456789012"
QUEUE = "quota-queue"
QUEUE_ARN = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/{QUEUE}"
POLICY = "quota-policy"
POLICY_ARN = f"arn:aws:batch:{REGION}:{ACCOUNT}:scheduling-policy/{POLICY}"
SE = "quota-se"
SE_ARN = f"arn:aws:batch:{REGION}:{ACCOUNT}:service-environment/{SE}"
G5 = "ml.g5.xlarge"
TRAINING: dict[str, Any] = {
    "AlgorithmSpecification": {
        "TrainingImage": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/llm-train:1.4",
        "TrainingInputMode": "File",
    },
    "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/SageMakerTraining",
    "OutputDataConfig": {"S3OutputPath": "s3://team-a/output"},
    "ResourceConfig": {"VolumeSizeInGB": 50},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
}
"""A CreateTrainingJob request as a job of the sagemaker backend carries it (no placement)."""


def batch_client() -> Any:
    return boto3.client("batch", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")


def share_arn(name: str) -> str:
    return f"arn:aws:batch:{REGION}:{ACCOUNT}:quota-share/{QUEUE}/{name}"


def queue_detail(**changes: Any) -> dict[str, Any]:
    """A DescribeJobQueues item of a quota-management queue (with the members the model requires)."""
    detail: dict[str, Any] = {
        "jobQueueName": QUEUE,
        "jobQueueArn": QUEUE_ARN,
        "state": "ENABLED",
        "status": "VALID",
        "priority": 1,
        "schedulingPolicyArn": POLICY_ARN,
        "computeEnvironmentOrder": [],
        "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": SE_ARN}],
        "jobQueueType": "SAGEMAKER_TRAINING",
    }
    detail.update(changes)
    return {k: v for k, v in detail.items() if v is not None}


def policy_detail(fair_share: bool = False) -> dict[str, Any]:
    if fair_share:
        return {"name": POLICY, "arn": POLICY_ARN, "fairsharePolicy": {"shareDecaySeconds": 0}}
    return {"name": POLICY, "arn": POLICY_ARN, "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}}


def environment_detail(capacity: Mapping[str, int]) -> dict[str, Any]:
    return {
        "serviceEnvironmentName": SE,
        "serviceEnvironmentArn": SE_ARN,
        "serviceEnvironmentType": "SAGEMAKER_TRAINING",
        "state": "ENABLED",
        "status": "VALID",
        "capacityLimits": [{"maxCapacity": n, "capacityUnit": t} for t, n in capacity.items()],
    }


def share_detail(
    name: str,
    limits: Mapping[str, int],
    strategy: str = "RESERVE",
    borrow_limit: int | None = None,
    preemption: bool = False,
    state: str = "ENABLED",
    status: str = "VALID",
) -> dict[str, Any]:
    """A ListQuotaShares item."""
    sharing: dict[str, Any] = {"strategy": strategy}
    if borrow_limit is not None:
        sharing["borrowLimit"] = borrow_limit
    return {
        "quotaShareName": name,
        "quotaShareArn": share_arn(name),
        "jobQueueArn": QUEUE_ARN,
        "capacityLimits": [{"maxCapacity": n, "capacityUnit": t} for t, n in limits.items()],
        "resourceSharingConfiguration": sharing,
        "preemptionConfiguration": {"inSharePreemption": "ENABLED" if preemption else "DISABLED"},
        "state": state,
        "status": status,
    }


def shares_of(config: QuotaConfig) -> list[dict[str, Any]]:
    """The quota shares AWS returns once ``config`` is applied (what CreateQuotaShare was given)."""
    return [
        {**quota_share(share), "quotaShareArn": share_arn(share.name), "jobQueueArn": QUEUE_ARN, "status": "VALID"}
        for share in config.shares
    ]


def state_of(config: QuotaConfig) -> JobQueueState:
    """The job queue as AWS returns it once ``config`` is applied."""
    return JobQueueState(queue_detail(), policy_detail(), [environment_detail(config.pool.capacity)], shares_of(config))


def pages(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)] or [[]]


def expect_reads(
    stub: Stubber,
    capacity: Mapping[str, int],
    shares: Iterable[Mapping[str, Any]],
    page_size: int = 100,
    queue: str = QUEUE,
) -> None:
    """The calls ``queue_state`` makes, in order, each with the parameters it must send:
    DescribeJobQueues, DescribeSchedulingPolicies, DescribeServiceEnvironments, then
    ListQuotaShares page by page (``nextToken``)."""
    stub.add_response("describe_job_queues", {"jobQueues": [queue_detail()]}, {"jobQueues": [queue]})
    stub.add_response("describe_scheduling_policies", {"schedulingPolicies": [policy_detail()]}, {"arns": [POLICY_ARN]})
    stub.add_response(
        "describe_service_environments",
        {"serviceEnvironments": [environment_detail(capacity)]},
        {"serviceEnvironments": [SE_ARN]},
    )
    split = pages(list(shares), page_size)
    for index, page in enumerate(split):
        answer: dict[str, Any] = {"quotaShares": page}
        params: dict[str, Any] = {"jobQueue": QUEUE_ARN, "maxResults": 100}
        if index + 1 < len(split):
            answer["nextToken"] = f"token-{index + 1}"
        if index > 0:
            params["nextToken"] = f"token-{index}"
        stub.add_response("list_quota_shares", answer, params)
