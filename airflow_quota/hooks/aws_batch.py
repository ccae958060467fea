"""``AwsBatchQuotaHook``: a job queue's AWS Batch quota-management objects, read and changed
through the amazon provider's ``AwsBaseHook`` (``client_type="batch"``, as the provider's own
``BatchClientHook``), so the Airflow AWS connection (``aws_conn_id``), its region, role and
endpoint apply as they do to every amazon operator.

Its calls are ``aws_batch/calls.py``'s ``BatchCalls`` (retried while AWS throttles or fails on
its side; ``AwsBatchRefused`` naming the operation, the object and AWS's message when AWS
refuses), on the client the connection gives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_quota.aws_batch.calls import (
    MAX_ATTEMPTS,
    PAGE_SIZE,
    AwsBatchRefused,
    AwsBatchUnavailable,
    BatchCalls,
    backoff,
    retried,
)
from airflow_quota.aws_batch.policy import Change, JobQueueState, Plan

__all__ = ["AwsBatchQuotaHook", "AwsBatchRefused", "AwsBatchUnavailable", "backoff", "retried"]


class AwsBatchQuotaHook(AwsBaseHook, BatchCalls):
    """The quota shares, service environment and scheduling policy of AWS Batch job queues.

    :param aws_conn_id: the Airflow AWS connection (default ``aws_default``; None: boto3's own
        credentials chain).
    :param region_name: the region, else the connection's.

    Other arguments are ``AwsBaseHook``'s.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "batch"
        super().__init__(*args, **kwargs)
        BatchCalls.__init__(self)
        self.max_attempts = MAX_ATTEMPTS

    @property
    def batch_client(self) -> Any:
        """The Batch client of the hook's connection."""
        return self.conn

    @property
    def calls_log(self) -> Any:
        """The hook's own log (the task's, in a task)."""
        return self.log

    # -- reading -------------------------------------------------------------------------------

    def describe_job_queue(self, job_queue: str) -> dict[str, Any] | None:
        """``DescribeJobQueues`` of one queue (name or ARN); None when there is none."""
        answer = self.call("describe_job_queues", f"job queue {job_queue}", jobQueues=[job_queue])
        queues: list[dict[str, Any]] = answer.get("jobQueues", [])
        return queues[0] if queues else None

    def list_quota_shares(self, job_queue: str) -> list[dict[str, Any]]:
        """``ListQuotaShares`` of a job queue, every page (``nextToken``)."""
        shares: list[dict[str, Any]] = []
        params: dict[str, Any] = {"jobQueue": job_queue, "maxResults": PAGE_SIZE}
        while True:
            answer = self.call("list_quota_shares", f"job queue {job_queue}", **params)
            shares += answer.get("quotaShares", [])
            token = answer.get("nextToken")
            if not token:
                return shares
            params["nextToken"] = token

    def queue_state(self, job_queue: str) -> JobQueueState | None:
        """Everything ``plan`` and ``import`` need of a job queue; None when there is no such queue."""
        queue = self.describe_job_queue(job_queue)
        if queue is None:
            return None
        policy = None
        if queue.get("schedulingPolicyArn"):
            arn = queue["schedulingPolicyArn"]
            answer = self.call("describe_scheduling_policies", f"scheduling policy {arn}", arns=[arn])
            policies = answer.get("schedulingPolicies", [])
            policy = policies[0] if policies else None
        environments: list[dict[str, Any]] = []
        order = sorted(queue.get("serviceEnvironmentOrder") or [], key=lambda entry: entry["order"])
        if order:
            names = [entry["serviceEnvironment"] for entry in order]
            answer = self.call(
                "describe_service_environments",
                f"job queue {job_queue}'s service environments",
                serviceEnvironments=names,
            )
            environments = answer.get("serviceEnvironments", [])
        shares = self.list_quota_shares(queue["jobQueueArn"]) if policy and policy.get("quotaSharePolicy") else []
        return JobQueueState(queue, policy, environments, shares)

    # -- changing ------------------------------------------------------------------------------

    def apply(self, plan: Plan, on_done: Callable[[Change, Mapping[str, Any]], None] | None = None) -> int:
        """Make the plan's calls in order; ``on_done`` hears of each one done. Returns how many
        were made. The first refusal stops it (``AwsBatchRefused``): the calls before it stay made,
        and planning again shows what is left."""
        if plan.refused:
            raise ValueError("a plan with refused settings is not applied")
        made = 0
        for change in plan.calls:
            assert change.operation is not None and change.request is not None
            method = _python_name(change.operation)
            answer = self.call(method, f"{change.kind} {change.name} (job queue {plan.job_queue})", **change.request)
            made += 1
            if on_done is not None:
                on_done(change, answer)
        return made


def _python_name(operation: str) -> str:
    """``CreateQuotaShare`` as botocore's client method, ``create_quota_share``."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation).lstrip("_")
