"""The ``sagemaker`` backend: one attempt is one SageMaker training job.

The quota scheduler has already chosen the entry of the job's preference list (an on-demand
instance type and count, or a training plan); this backend turns the job's training request
into a CreateTrainingJob call with that choice filled in, follows the job with
ListTrainingJobs (which jobs changed) and DescribeTrainingJob (what became of one), and preempts
it with StopTrainingJob.

Why plain boto3 and not the amazon provider's ``SageMakerHook``: the hook lives in
``airflow.providers.amazon`` and needs an Airflow installation and an Airflow connection to
build its client, while the quota scheduler is a standalone process that must run (and be
tested) without Airflow. The three calls it needs are single boto3 calls, so the hook would add
a heavy dependency for nothing; its waiting helpers (``wait_for_completion``) do not fit a
scheduler that polls many attempts in one loop either.

Idempotence (``base.py``): the training job name is derived deterministically from
``name_prefix``, the job name and the attempt key, so a scheduler that restarts after a crash
finds the job it started before instead of starting a second one. ``start`` looks the name up
first and also treats an "already exists" answer from CreateTrainingJob as success. SageMaker
never reuses a training job name, so give each quota database its own ``name_prefix``: a fresh
database starting again at job id 1 would otherwise find the old database's jobs.

Status mapping (``report_from_description``), from TrainingJobStatus and SecondaryStatus:

==========  ==========================================================  ===================================
status      SecondaryStatus or FailureReason                            AttemptStatus
==========  ==========================================================  ===================================
InProgress  Starting, Pending, LaunchingMLInstances,                    PENDING
            PreparingTrainingStack, Downloading, DownloadingTrainingImage
InProgress  Training, Uploading, Updating, Restarting                   RUNNING (running_since: TrainingStartTime)
InProgress  anything else                                               RUNNING if training began, else PENDING
Stopping    any (the instances are up while it checkpoints)             RUNNING if training began, else PENDING
Completed   any                                                         SUCCEEDED
Failed      FailureReason mentions CapacityError / InsufficientCapacity  CAPACITY_ERROR
Failed      any other                                                   FAILED (reason: FailureReason)
Stopped     stopped for capacity (see below)                            CAPACITY_ERROR
Stopped     MaxRuntimeExceeded                                          FAILED
Stopped     any other                                                   STOPPED
Deleting    any                                                         STOPPED
not found   DescribeTrainingJob says the job does not exist             UNKNOWN
==========  ==========================================================  ===================================

A job is *stopped for capacity* when its FailureReason or its last secondary status message
mentions a capacity error, insufficient capacity or "waiting for capacity" (the AWS Batch
documentation describes a capacity timeout as Stopped with a status "timed out in pending
waiting for capacity"), or when its SecondaryStatus is ``MaxWaitTimeExceeded`` or
``Interrupted`` (managed spot capacity that never came or was taken back).

Two deliberate choices: ``Stopping`` is not yet STOPPED, because ``base.py`` promises STOPPED
only "once it is down" and a preemptor placed earlier would find the victim's instances still
held; and ``MaxRuntimeExceeded`` is a failure of the job itself (its own time limit), not a stop
the scheduler asked for, so requeueing it as preempted would only repeat it.

After CAPACITY_ERROR the scheduler skips the placed entry for ``capacity_backoff_seconds``
(docs/model.md rule 6.5); the backend only carries that setting.

botocore (and boto3) are imported by the calls that need them, not with this module: the quota
scheduler registers this backend at every start, and a new leader should not spend its start-up
importing an AWS SDK that only SageMaker jobs use (``benchmarks/scheduler_start.py``).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_quota.service.backends.base import (
    AttemptReport,
    AttemptSpec,
    AttemptStatus,
    BackendError,
    BackendThrottled,
    ChangePage,
    ListedChange,
    StartedAttempt,
)

__all__ = [
    "SageMakerBackend",
    "report_from_description",
    "request_problems",
    "status_from_summary",
    "training_job_name",
]

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = 63
"""SageMaker's limit for a TrainingJobName (pattern ``[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}``)."""
MAX_PREFIX_LENGTH = 32
"""Leaves room in a name for the attempt key and some of the job name."""

PENDING_SECONDARY = frozenset(
    {"Starting", "Pending", "LaunchingMLInstances", "PreparingTrainingStack", "Downloading", "DownloadingTrainingImage"}
)
"""InProgress secondary statuses before training runs: instances are being provisioned or prepared."""
RUNNING_SECONDARY = frozenset({"Training", "Uploading", "Updating", "Restarting"})
"""InProgress secondary statuses once the training container has started."""
CAPACITY_STOP_SECONDARY = frozenset({"MaxWaitTimeExceeded", "Interrupted"})
"""Stopped secondary statuses that mean the provider had (or kept) no capacity."""

CAPACITY_PATTERN = re.compile(r"capacity\s*error|insufficient\s*\w*\s*capacity|waiting\s+for\s+capacity", re.IGNORECASE)
"""What a FailureReason or status message says when the provider had no capacity, e.g.
``CapacityError: Unable to provision requested ML compute capacity ...`` or
``InsufficientCapacityError``."""

NOT_FOUND_PATTERN = re.compile(r"not\s+found|could\s+not\s+find|does\s+not\s+exist", re.IGNORECASE)
"""DescribeTrainingJob on an unknown name: SageMaker says "Requested resource not found.",
moto says "Could not find training job '...'"."""

THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
    }
)
"""Error codes of a call AWS refused for its rate (the ones botocore's standard retry mode
treats as throttling); an HTTP 429 counts too."""

DEFAULT_POLL_INTERVAL_SECONDS = 30.0
"""As the amazon provider's ``check_interval`` for SageMaker training jobs."""
DEFAULT_LIST_INTERVAL_SECONDS = 5.0
"""How often the scheduler lists the training jobs changed (ListTrainingJobs with
LastModifiedTimeAfter): a change is described within about this long, whatever the number of jobs."""
LIST_PAGE_SIZE = 100
"""ListTrainingJobs' MaxResults limit."""
DEFAULT_POLL_CALLS_PER_SECOND = 35.0
"""The most SageMaker calls a second, polls, starts and stops together (burst included, at most
39.4 in any second): 1,000 open jobs described every 30 s need 33.3."""

ALREADY_EXISTS_PATTERN = re.compile(r"already\s+exists|must\s+be\s+unique", re.IGNORECASE)

TAG_KEY_PREFIX = "airflow-quota:"
_TAG_VALUE_UNSAFE = re.compile(r"[^\w.:/=+\-@ ]")


def _sanitize(text: str) -> str:
    """``text`` with every run of characters a training job name cannot hold turned into one
    hyphen, and no hyphen at either end."""
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-")


def training_job_name(prefix: str, attempt: AttemptSpec) -> str:
    """The deterministic TrainingJobName of an attempt: ``<prefix>-<job name>-<key>``.

    The attempt key (job id and attempt number) is always kept whole, since it is what makes
    the name unique; the job name is only there for people reading the console and is shortened
    (with a short hash of the full name, so two long names sharing a beginning stay apart) when
    the whole would exceed 63 characters.
    """
    safe_prefix = _sanitize(prefix)
    key = _sanitize(attempt.key)
    job = _sanitize(attempt.job_name)
    if not safe_prefix:
        raise ValueError(f"name_prefix {prefix!r} has no letter or digit to start a training job name with")
    head = f"{safe_prefix}-"
    tail = f"-{key}"
    room = MAX_NAME_LENGTH - len(head) - len(tail)
    if len(job) > room:
        digest = hashlib.sha256(attempt.job_name.encode()).hexdigest()[:6]
        keep = room - len(digest) - 1
        job = f"{job[:keep].rstrip('-')}-{digest}" if keep >= 1 else ""
    name = f"{head}{job}{tail}" if job else f"{safe_prefix}{tail}"
    return name[:MAX_NAME_LENGTH]


@functools.cache
def _create_training_job_shape() -> Any:
    """CreateTrainingJob's input shape from botocore's bundled SageMaker model (no credentials,
    no network), loaded once."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model("CreateTrainingJob").input_shape


def request_problems(request: Mapping[str, Any]) -> list[str]:
    """Every problem botocore's own SageMaker model finds in a CreateTrainingJob request
    (missing required fields, unknown fields, wrong types, out-of-range numbers), one line each,
    naming the field; empty when the request is valid."""
    from botocore.validate import ParamValidator

    report = ParamValidator().validate(dict(request), _create_training_job_shape())
    if not report.has_errors():
        return []
    return [line.strip() for line in report.generate_report().splitlines() if line.strip()]


def _epoch(value: Any) -> float | None:
    """Epoch seconds from a botocore timestamp (a ``datetime``), or None when absent."""
    return value.timestamp() if isinstance(value, datetime) else None


def _last_status_message(description: Mapping[str, Any]) -> str:
    transitions = description.get("SecondaryStatusTransitions") or []
    return str(transitions[-1].get("StatusMessage", "")) if transitions else ""


def _stopped_for_capacity(description: Mapping[str, Any]) -> bool:
    """Whether a Stopped job was stopped by SageMaker because it found no capacity."""
    if description.get("SecondaryStatus") in CAPACITY_STOP_SECONDARY:
        return True
    texts = (str(description.get("FailureReason", "")), _last_status_message(description))
    return any(CAPACITY_PATTERN.search(text) for text in texts)


def status_from_summary(summary: Mapping[str, Any]) -> AttemptStatus | None:
    """What a ListTrainingJobs summary alone shows: PENDING or RUNNING for an InProgress job whose
    SecondaryStatus says so (the table in the module docstring); None for everything else (an
    ended job, whose outcome only DescribeTrainingJob has, a Stopping job, a summary without
    SecondaryStatus as moto's): the poller then describes the job."""
    if summary.get("TrainingJobStatus") != "InProgress":
        return None
    secondary = summary.get("SecondaryStatus")
    if secondary in PENDING_SECONDARY:
        return AttemptStatus.PENDING
    if secondary in RUNNING_SECONDARY:
        return AttemptStatus.RUNNING
    return None


@dataclass(frozen=True)
class _ListCursor:
    """Where a listing of changes goes on: the AWS connections still to list (the first one's
    listing at ``token``), so attempts run under other accounts' credentials are listed too."""

    connections: tuple[str | None, ...]
    token: str | None = None


def report_from_description(description: Mapping[str, Any]) -> AttemptReport:
    """Map a DescribeTrainingJob response to an ``AttemptReport`` (the table in the module
    docstring). Pure, so the whole table is tested without any client."""
    status = str(description.get("TrainingJobStatus", ""))
    secondary = str(description.get("SecondaryStatus", ""))
    failure = description.get("FailureReason")
    started = _epoch(description.get("TrainingStartTime"))
    ended = _epoch(description.get("TrainingEndTime")) or _epoch(description.get("LastModifiedTime"))
    message = _last_status_message(description)
    detail = f"{secondary}: {message}" if message else secondary or None

    if status in ("InProgress", "Stopping"):
        if status == "InProgress" and secondary in PENDING_SECONDARY:
            return AttemptReport(AttemptStatus.PENDING, reason=detail)
        if status == "InProgress" and secondary in RUNNING_SECONDARY:
            return AttemptReport(AttemptStatus.RUNNING, reason=detail, running_since=started)
        # Stopping, or a secondary status this mapping does not know yet: the instances are up
        # (or coming up), so the attempt still holds its capacity.
        reason = detail
        if status == "Stopping":
            reason = "Stopping" if secondary in ("", "Stopping") and not message else f"Stopping ({detail})"
        if started is not None:
            return AttemptReport(AttemptStatus.RUNNING, reason=reason, running_since=started)
        return AttemptReport(AttemptStatus.PENDING, reason=reason)
    if status == "Completed":
        return AttemptReport(AttemptStatus.SUCCEEDED, running_since=started, ended_at=ended)
    if status == "Failed":
        reason = str(failure) if failure else f"Failed ({detail})"
        if CAPACITY_PATTERN.search(reason):
            return AttemptReport(AttemptStatus.CAPACITY_ERROR, reason=reason, running_since=started, ended_at=ended)
        return AttemptReport(AttemptStatus.FAILED, reason=reason, running_since=started, ended_at=ended)
    if status == "Stopped":
        reason = str(failure) if failure else detail or "Stopped"
        if _stopped_for_capacity(description):
            return AttemptReport(AttemptStatus.CAPACITY_ERROR, reason=reason, running_since=started, ended_at=ended)
        if secondary == "MaxRuntimeExceeded":
            return AttemptReport(AttemptStatus.FAILED, reason=reason, running_since=started, ended_at=ended)
        return AttemptReport(AttemptStatus.STOPPED, reason=reason, running_since=started, ended_at=ended)
    if status == "Deleting":
        return AttemptReport(AttemptStatus.STOPPED, reason="Deleting", running_since=started, ended_at=ended)
    raise BackendError(
        f"training job {description.get('TrainingJobName')!r} has a TrainingJobStatus"
        f" this backend does not know: {status!r}"
    )


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _error_message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", ""))


def _is_throttling(exc: ClientError) -> bool:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return _error_code(exc) in THROTTLING_CODES or status == 429


def _is_not_found(exc: ClientError) -> bool:
    return _error_code(exc) in ("ValidationException", "ResourceNotFound") and bool(
        NOT_FOUND_PATTERN.search(_error_message(exc))
    )


class SageMakerBackend:
    """Runs each attempt as a SageMaker training job (see the module docstring).

    ``client`` is a boto3 SageMaker client; when None, one is created on first use from
    ``region_name`` and ``endpoint_url`` (and the usual AWS credential chain), so building the
    backend needs no credentials or network. ``capacity_backoff_seconds`` is how long the
    scheduler skips an entry after this backend reports CAPACITY_ERROR for it.
    The scheduler lists the training jobs changed every ``list_interval_seconds``
    (``--sagemaker-list-seconds``, 5 s; ``changed_since``: ListTrainingJobs with
    LastModifiedTimeAfter and this backend's name prefix, 100 a page) and describes the ones
    whose change matters, so a change is noticed within about that long whatever the number of
    jobs; ``poll_interval_seconds`` (``--sagemaker-poll-seconds``, 30 s) x 10 is how often each
    open job is described anyway (a safety net), and the interval itself how often while
    ListTrainingJobs fails (e.g. the policy lacks ``sagemaker:ListTrainingJobs``).
    ``poll_calls_per_second`` caps every call the scheduler makes, listings, polls, starts and
    stops together, whatever the number of jobs (``--sagemaker-poll-rate``). A throttled call
    raises ``BackendThrottled``: the scheduler pauses and makes it again.
    """

    name = "sagemaker"
    calls_per_start = 2
    """A start is a DescribeTrainingJob (does it exist already?) and a CreateTrainingJob: what
    it costs in the scheduler's per-backend rate (``service/polling.py``)."""
    calls_per_stop = 1

    def __init__(
        self,
        client: Any | None = None,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        name_prefix: str = "quota",
        capacity_backoff_seconds: float = 600,
        poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS,
        poll_calls_per_second: float | None = DEFAULT_POLL_CALLS_PER_SECOND,
        list_interval_seconds: float = DEFAULT_LIST_INTERVAL_SECONDS,
    ) -> None:
        if not _sanitize(name_prefix):
            raise ValueError(f"name_prefix {name_prefix!r} must contain a letter or digit")
        if len(name_prefix) > MAX_PREFIX_LENGTH:
            raise ValueError(f"name_prefix {name_prefix!r} is longer than {MAX_PREFIX_LENGTH} characters")
        if capacity_backoff_seconds < 0:
            raise ValueError(f"capacity_backoff_seconds must be ≥ 0, not {capacity_backoff_seconds}")
        if poll_interval_seconds < 0:
            raise ValueError(f"poll_interval_seconds must be ≥ 0, not {poll_interval_seconds}")
        if list_interval_seconds <= 0:
            raise ValueError(f"list_interval_seconds must be > 0, not {list_interval_seconds}")
        self._client = client
        self._client_lock = threading.Lock()
        self._connection_clients: dict[str, Any] = {}
        self._default: Any | None = None
        self.region_name = region_name
        self.endpoint_url = endpoint_url
        self.name_prefix = name_prefix
        self.capacity_backoff_seconds = capacity_backoff_seconds
        self.poll_interval_seconds = poll_interval_seconds
        self.poll_calls_per_second = poll_calls_per_second
        self.list_interval_seconds = list_interval_seconds

    @property
    def client(self) -> Any:
        """The boto3 SageMaker client, created on first use when none was given."""
        if self._client is not None:
            return self._client
        with self._client_lock:
            if self._default is None:
                self._default = self._default_client()
            return self._default

    def _default_client(self) -> Any:
        import boto3  # only when needed: an injected client needs no boto3 session

        return boto3.client("sagemaker", region_name=self.region_name, endpoint_url=self.endpoint_url)

    def client_for(self, attempt: AttemptSpec) -> Any:
        """The client for the attempt's calls: with the credentials, region and endpoint of its
        Airflow AWS connection (``aws_conn_id``: the job's, else its share's, read through
        Airflow's connections and secrets backends by the amazon provider's ``AwsBaseHook``), or
        the backend's own client when it names none, when a client was given (tests), or when
        Airflow is not installed here (then boto3's own credential chain, said once in the log)."""
        conn_id = attempt.aws_conn_id
        if conn_id is None or self._client is not None:
            return self.client
        with self._client_lock:
            found = self._connection_clients.get(conn_id)
            if found is None:
                found = self._connection_clients[conn_id] = self._connection_client(conn_id)
            return found

    def _connection_client(self, conn_id: str) -> Any:
        try:
            from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
        except ImportError:
            log.warning(
                "AWS connection %r: the amazon provider is not installed here, so the scheduler's own AWS"
                " credentials are used for its jobs",
                conn_id,
            )
            return self._default_client()
        try:
            # The provider quietly uses boto3's own credentials for a connection it cannot find:
            # a team's jobs must never run as the scheduler's identity, so look it up first.
            AwsBaseHook.get_connection(conn_id)
            return AwsBaseHook(aws_conn_id=conn_id, client_type="sagemaker").get_conn()
        except Exception as exc:  # an unknown connection, bad extras, an assume-role refused
            raise BackendError(f"AWS connection {conn_id!r}: cannot build a SageMaker client: {exc}") from exc

    def job_name(self, attempt: AttemptSpec) -> str:
        """The TrainingJobName this backend uses for ``attempt``."""
        return training_job_name(self.name_prefix, attempt)

    # -- the request ---------------------------------------------------------------------------

    def build_request(self, attempt: AttemptSpec) -> dict[str, Any]:
        """The CreateTrainingJob request for ``attempt``: a deep copy of ``attempt.training``
        with the placement filled in. ``attempt.training`` itself is never changed (it is the
        job's stored request, reused by every attempt). The job is also tagged
        ``airflow-quota:job-id``, ``airflow-quota:attempt`` and ``airflow-quota:share``, so cost
        allocation and the console can tell which quota job and share a training job belongs to."""
        name = self.job_name(attempt)
        request: dict[str, Any] = copy.deepcopy(dict(attempt.training))
        request["TrainingJobName"] = name

        resource = dict(request.get("ResourceConfig") or {})
        for chosen_elsewhere in ("InstancePreferences", "InstanceGroups"):
            if chosen_elsewhere in resource:
                raise BackendError(
                    f"training job {name!r} (attempt {attempt.key}): ResourceConfig.{chosen_elsewhere} is not allowed,"
                    " the quota scheduler chooses the instance type and count from the job's preference list"
                )
        resource["InstanceType"] = attempt.instance_type
        resource["InstanceCount"] = attempt.count
        if attempt.training_plan is not None or attempt.training_plan_arn is not None:
            if not attempt.training_plan_arn:
                raise BackendError(
                    f"training job {name!r} (attempt {attempt.key}): training plan {attempt.training_plan!r}"
                    " has no ARN, SageMaker needs ResourceConfig.TrainingPlanArn"
                )
            resource["TrainingPlanArn"] = attempt.training_plan_arn
        else:
            resource.pop("TrainingPlanArn", None)  # an on-demand entry: never the request's own plan
        request["ResourceConfig"] = resource

        if attempt.checkpoint_uri is not None:
            if not attempt.checkpoint_uri.startswith(("s3://", "https://")):
                raise BackendError(
                    f"training job {name!r} (attempt {attempt.key}): checkpoint_uri {attempt.checkpoint_uri!r}"
                    " is not an S3 URI, SageMaker saves checkpoints only to S3"
                )
            request["CheckpointConfig"] = {**(request.get("CheckpointConfig") or {}), "S3Uri": attempt.checkpoint_uri}

        tags = [dict(tag) for tag in request.get("Tags") or []]
        present = {tag.get("Key") for tag in tags}
        ours = {
            f"{TAG_KEY_PREFIX}job-id": str(attempt.job_id),
            f"{TAG_KEY_PREFIX}attempt": str(attempt.attempt),
            f"{TAG_KEY_PREFIX}share": _TAG_VALUE_UNSAFE.sub("_", attempt.share)[:256],
        }
        tags.extend({"Key": key, "Value": value} for key, value in ours.items() if key not in present)
        request["Tags"] = tags
        return request

    def _validate(self, request: dict[str, Any], attempt: AttemptSpec) -> None:
        """Refuse a request botocore's own service model rejects, before any call is made, with
        every problem botocore finds (missing required fields, unknown fields, wrong types)."""
        problems = request_problems(request)
        if problems:
            raise BackendError(
                f"training job {request['TrainingJobName']!r} (attempt {attempt.key}): the training request is"
                f" not a valid CreateTrainingJob request: {'; '.join(problems)}"
            )

    # -- Backend -------------------------------------------------------------------------------

    def start(self, attempt: AttemptSpec) -> StartedAttempt:
        """Create the attempt's training job; do nothing if a job of that name exists already
        (it was started before a crash, or by an earlier call). Returns its name and ARN."""
        from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

        request = self.build_request(attempt)
        name = request["TrainingJobName"]
        self._validate(request, attempt)
        existing = self._describe(name, attempt)
        if existing is not None:
            log.info("training job %s (attempt %s) exists already: not started again", name, attempt.key)
            return StartedAttempt(name, existing.get("TrainingJobArn"))
        try:
            created = self.client_for(attempt).create_training_job(**request)
        except ClientError as exc:
            if _error_code(exc) == "ResourceInUse" or ALREADY_EXISTS_PATTERN.search(_error_message(exc)):
                log.info("training job %s (attempt %s) exists already: not started again", name, attempt.key)
                return StartedAttempt(name)  # started by a racing call: its ARN is SageMaker's to tell
            if _is_throttling(exc):  # not created: the scheduler asks again after a pause
                raise BackendThrottled(
                    f"SageMaker CreateTrainingJob for training job {name!r} (attempt {attempt.key}) throttled: {exc}"
                ) from exc
            raise BackendError(
                f"SageMaker CreateTrainingJob for training job {name!r} (attempt {attempt.key}) failed: {exc}"
            ) from exc
        except ParamValidationError as exc:
            raise BackendError(
                f"training job {name!r} (attempt {attempt.key}): the training request is not a valid"
                f" CreateTrainingJob request: {exc}"
            ) from exc
        except BotoCoreError as exc:
            raise BackendError(
                f"SageMaker CreateTrainingJob for training job {name!r} (attempt {attempt.key}) failed: {exc}"
            ) from exc
        log.info(
            "training job %s (attempt %s) created on %d x %s%s",
            name,
            attempt.key,
            attempt.count,
            attempt.instance_type,
            f" (plan {attempt.training_plan_arn})" if attempt.training_plan_arn else "",
        )
        return StartedAttempt(name, created.get("TrainingJobArn") if isinstance(created, Mapping) else None)

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        """What SageMaker says of the attempt's training job; UNKNOWN when it has none."""
        name = self.job_name(attempt)
        description = self._describe(name, attempt)
        if description is None:
            return AttemptReport(AttemptStatus.UNKNOWN)
        return report_from_description(description)

    def changed_since(self, attempts: Sequence[AttemptSpec], since: float, page: object | None) -> ChangePage:
        """One ListTrainingJobs page (``ListsChanges``): the training jobs of ``attempts`` modified
        after ``since``, with this backend's name prefix, 100 a page, under each AWS connection the
        attempts use in turn. A job listed that is not one of ``attempts`` is left out; SageMaker
        (or moto) ignoring the filter only makes the pages longer."""
        from botocore.exceptions import BotoCoreError, ClientError

        by_connection: dict[str | None, dict[str, AttemptSpec]] = {}
        for attempt in attempts:
            by_connection.setdefault(attempt.aws_conn_id, {})[self.job_name(attempt)] = attempt
        if isinstance(page, _ListCursor):
            cursor = page
        else:
            cursor = _ListCursor(tuple(sorted(by_connection, key=lambda conn: conn or "")))
        if not cursor.connections:
            return ChangePage({})
        conn_id = cursor.connections[0]
        names = by_connection.get(conn_id, {})
        request: dict[str, Any] = {
            "LastModifiedTimeAfter": datetime.fromtimestamp(since, timezone.utc),
            "NameContains": f"{_sanitize(self.name_prefix)}-",
            "MaxResults": LIST_PAGE_SIZE,
        }
        if cursor.token:
            request["NextToken"] = cursor.token
        client = self.client_for(next(iter(names.values()))) if names else self.client
        try:
            response = client.list_training_jobs(**request)
        except ClientError as exc:
            if _is_throttling(exc):
                raise BackendThrottled(f"SageMaker ListTrainingJobs throttled: {exc}") from exc
            raise BackendError(f"SageMaker ListTrainingJobs failed: {exc}") from exc
        except BotoCoreError as exc:
            raise BackendError(f"SageMaker ListTrainingJobs failed: {exc}") from exc
        changed: dict[tuple[int, int], ListedChange] = {}
        for summary in response.get("TrainingJobSummaries") or []:
            ours = names.get(summary.get("TrainingJobName", ""))
            if ours is not None:
                modified = _epoch(summary.get("LastModifiedTime"))
                changed[ours.job_id, ours.attempt] = ListedChange(
                    since if modified is None else modified, status_from_summary(summary)
                )
        token = response.get("NextToken")
        following = _ListCursor(cursor.connections, token) if token else _ListCursor(cursor.connections[1:])
        return ChangePage(changed, following if following.connections else None)

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        """Ask SageMaker to stop the attempt's training job.

        ``grace_seconds`` is informational here: SageMaker itself sends the training container
        SIGTERM and gives it 120 seconds to save its checkpoint before it is killed, and that
        time cannot be changed per call. Stopping a job that has already ended, is already
        stopping, or was never created is harmless (``base.py``): those errors are ignored.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        name = self.job_name(attempt)
        try:
            self.client_for(attempt).stop_training_job(TrainingJobName=name)
        except ClientError as exc:
            if _is_not_found(exc):
                log.info("training job %s (attempt %s) to stop does not exist: nothing to stop", name, attempt.key)
                return
            if _is_throttling(exc):  # not asked: the scheduler asks again after a pause
                raise BackendThrottled(
                    f"SageMaker StopTrainingJob for training job {name!r} (attempt {attempt.key}) throttled: {exc}"
                ) from exc
            if _error_code(exc) == "ValidationException":
                # SageMaker refuses to stop a job that is not in progress; its wording is not
                # documented, so ask for the job's status rather than trust the message.
                description = self._describe(name, attempt)
                if description is None or description.get("TrainingJobStatus") != "InProgress":
                    log.info("training job %s (attempt %s) is not in progress: nothing to stop", name, attempt.key)
                    return
            raise BackendError(
                f"SageMaker StopTrainingJob for training job {name!r} (attempt {attempt.key}) failed: {exc}"
            ) from exc
        except BotoCoreError as exc:
            raise BackendError(
                f"SageMaker StopTrainingJob for training job {name!r} (attempt {attempt.key}) failed: {exc}"
            ) from exc
        log.info(
            "training job %s (attempt %s) asked to stop (grace %.0f s requested; SageMaker allows 120 s)",
            name,
            attempt.key,
            grace_seconds,
        )

    def _describe(self, name: str, attempt: AttemptSpec) -> dict[str, Any] | None:
        """DescribeTrainingJob, or None when SageMaker has no job of that name."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response: dict[str, Any] = self.client_for(attempt).describe_training_job(TrainingJobName=name)
        except ClientError as exc:
            if _is_not_found(exc):
                return None
            if _is_throttling(exc):
                raise BackendThrottled(
                    f"SageMaker DescribeTrainingJob for training job {name!r} (attempt {attempt.key}) throttled: {exc}"
                ) from exc
            raise BackendError(
                f"SageMaker DescribeTrainingJob for training job {name!r} (attempt {attempt.key}) failed: {exc}"
            ) from exc
        except BotoCoreError as exc:
            raise BackendError(
                f"SageMaker DescribeTrainingJob for training job {name!r} (attempt {attempt.key}) failed: {exc}"
            ) from exc
        return response
