"""``AwsBatchQuotaHook``: a job queue's AWS Batch quota-management objects, read and changed
through the amazon provider's ``AwsBaseHook`` (``client_type="batch"``, as the provider's own
``BatchClientHook``), so the Airflow AWS connection (``aws_conn_id``), its region, role and
endpoint apply as they do to every amazon operator.

Every call is retried while AWS throttles (``TooManyRequestsException``, HTTP 429) or fails on
its side (HTTP 5xx), with exponential back-off and jitter, here and not only in botocore: the
retry is the hook's own, so it is the same whatever retry mode the connection's botocore
configuration sets. AWS refusing a request (``ClientException``) raises ``AwsBatchRefused``
naming the operation, the object and AWS's message.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from botocore.exceptions import BotoCoreError, ClientError

from airflow_quota.aws_batch.policy import Change, JobQueueState, Plan
from airflow_quota.exceptions import QuotaError, Refused

THROTTLED = frozenset(
    {"TooManyRequestsException", "ThrottlingException", "Throttling", "RequestLimitExceeded", "SlowDown"}
)
MAX_ATTEMPTS = 6
BACKOFF_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 20.0
PAGE_SIZE = 100
"""``ListQuotaShares.maxResults``: at most 100 a page."""


class AwsBatchRefused(Refused):
    """AWS Batch refused a request (a ClientError): the message names the operation, the
    object it was for and AWS's code and message. Nothing after it was called."""


class AwsBatchUnavailable(QuotaError):
    """AWS Batch could not be reached, or kept throttling or failing after every retry."""


def backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): 1, 2, 4, ... up to 20, each with up to
    half of it taken off at random, so that clients throttled together do not retry together."""
    full = min(BACKOFF_CAP_SECONDS, BACKOFF_SECONDS * float(2 ** (attempt - 1)))
    return full * (1 - random.random() / 2)


def retried(code: str | None, status: int | None) -> bool:
    """Whether an AWS error is worth retrying: throttling, or a failure on AWS's side."""
    return code in THROTTLED or status == 429 or (status is not None and status >= 500)


class AwsBatchQuotaHook(AwsBaseHook):
    """The quota shares, service environment and scheduling policy of AWS Batch job queues.

    :param aws_conn_id: the Airflow AWS connection (default ``aws_default``; None: boto3's own
        credentials chain).
    :param region_name: the region, else the connection's.

    Other arguments are ``AwsBaseHook``'s.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "batch"
        super().__init__(*args, **kwargs)
        self.sleep: Callable[[float], None] = time.sleep
        """How the hook waits between retries (tests record the waits instead)."""
        self.max_attempts = MAX_ATTEMPTS

    def call(self, operation: str, subject: str, **params: Any) -> dict[str, Any]:
        """``operation`` (botocore's Python name, e.g. ``list_quota_shares``) with ``params``,
        retried while throttled; ``subject`` names the object in an error."""
        client = self.conn
        name = client.meta.method_to_api_mapping.get(operation, operation)
        for attempt in range(1, self.max_attempts + 1):
            try:
                answer: dict[str, Any] = getattr(client, operation)(**params)
                return answer
            except ClientError as exc:
                error = exc.response.get("Error", {})
                code = error.get("Code")
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                message = error.get("Message") or str(exc)
                if not retried(code, status):
                    raise AwsBatchRefused(f"{name} of {subject}: AWS Batch refused it: {code}: {message}") from None
                if attempt == self.max_attempts:
                    raise AwsBatchUnavailable(
                        f"{name} of {subject}: AWS Batch answered {code} {attempt} times in a row; try again later"
                    ) from None
                self.log.info("%s of %s: %s, retrying (attempt %d)", name, subject, code, attempt + 1)
                self.sleep(backoff(attempt))
            except BotoCoreError as exc:
                raise AwsBatchUnavailable(f"{name} of {subject}: cannot call AWS Batch: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

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
