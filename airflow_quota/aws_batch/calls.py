"""AWS Batch calls, each retried while AWS throttles (``TooManyRequestsException``, HTTP 429) or
fails on its side (HTTP 5xx), with exponential back-off and jitter, here and not only in botocore:
the retry is ours, so it is the same whatever retry mode the client's configuration sets. AWS
refusing a request (``ClientException``) raises ``AwsBatchRefused`` naming the operation, the
object and AWS's message.

``BatchCalls`` holds a botocore Batch client: the Airflow hook (``hooks/aws_batch.py``) builds it
from an Airflow AWS connection; the delegating quota scheduler (``service/delegation.py``), which
runs without Airflow, is given one.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from airflow_quota.exceptions import QuotaError, Refused

log = logging.getLogger(__name__)

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


class BatchCalls:
    """AWS Batch's calls on ``batch_client``, retried (see the module docstring).

    :param client: a botocore Batch client (a subclass may build its own: ``batch_client``).
    """

    max_attempts: int = MAX_ATTEMPTS
    """How many times a throttled call is made before ``AwsBatchUnavailable`` (1: never retried
    here; the caller backs off)."""

    def __init__(self, client: Any = None) -> None:
        self._client = client
        self.sleep: Callable[[float], None] = time.sleep
        """How the calls wait between retries (tests record the waits instead)."""

    @property
    def batch_client(self) -> Any:
        return self._client

    @property
    def calls_log(self) -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
        """Where a retry is said."""
        return log

    def call(self, operation: str, subject: str, **params: Any) -> dict[str, Any]:
        """``operation`` (botocore's Python name, e.g. ``list_quota_shares``) with ``params``,
        retried while throttled; ``subject`` names the object in an error."""
        client = self.batch_client
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
                self.calls_log.info("%s of %s: %s, retrying (attempt %d)", name, subject, code, attempt + 1)
                self.sleep(backoff(attempt))
            except BotoCoreError as exc:
                raise AwsBatchUnavailable(f"{name} of {subject}: cannot call AWS Batch: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def submit_service_job(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """``SubmitServiceJob``; with the request's ``clientToken``, submitting again returns
        the job AWS already has."""
        return self.call("submit_service_job", f"job {request['jobName']}", **request)

    def update_service_job(self, job_id: str, priority: int) -> dict[str, Any]:
        """``UpdateServiceJob``: the job's new scheduling priority."""
        return self.call("update_service_job", f"service job {job_id}", jobId=job_id, schedulingPriority=priority)

    def terminate_service_job(self, job_id: str, reason: str) -> dict[str, Any]:
        """``TerminateServiceJob``: AWS ends the job (FAILED, ``isTerminated``)."""
        return self.call("terminate_service_job", f"service job {job_id}", jobId=job_id, reason=reason)

    def list_service_jobs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """One page of ``ListServiceJobs`` (``params`` as ``ShareSweep.request`` makes them)."""
        return self.call("list_service_jobs", f"job queue {params.get('jobQueue')}", **params)

    def describe_service_job(self, job_id: str) -> dict[str, Any]:
        """``DescribeServiceJob`` of one job."""
        return self.call("describe_service_job", f"service job {job_id}", jobId=job_id)

    def job_queue_snapshot(self, job_queue: str) -> dict[str, Any]:
        """``GetJobQueueSnapshot``: the front of the queue and of each quota share, and what
        each share uses."""
        return self.call("get_job_queue_snapshot", f"job queue {job_queue}", jobQueue=job_queue)
