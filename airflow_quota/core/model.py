"""Jobs, their states and reasons, and the decisions a cycle returns (docs/model.md sections 2, 3, 6)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from airflow_quota.core.config import InstanceTypeName, Name, Uri, at_most
from airflow_quota.core.wording import MAX_PREFERENCES, too_many_preferences


class JobState(str, Enum):
    """docs/model.md rule 3.1; shared by the store, backends, trigger and sensor."""

    SUBMITTED = "SUBMITTED"
    RUNNABLE = "RUNNABLE"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def holds_capacity(self) -> bool:
        return self in (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING)

    @property
    def is_final(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED)


WAITING_STATES = (JobState.SUBMITTED.value, JobState.RUNNABLE.value)
"""State names of jobs not placed yet (as stored, for queries)."""
HOLDING_STATES = tuple(state.value for state in JobState if state.holds_capacity)
"""State names of jobs that hold capacity."""
LIVE_STATES = tuple(state.value for state in JobState if not state.is_final)
"""State names of jobs that have not ended."""
FINAL_STATES = frozenset(state.value for state in JobState if state.is_final)
"""State names of jobs that have ended."""


class PendingReason(str, Enum):
    """Why a RUNNABLE job waits."""

    WAITING_FOR_QUOTA = "WAITING_FOR_QUOTA"
    WAITING_FOR_CAPACITY = "WAITING_FOR_CAPACITY"
    WAITING_FOR_PLAN = "WAITING_FOR_PLAN"
    WAITING_FOR_VICTIMS = "WAITING_FOR_VICTIMS"
    HELD_FOR_STARVING_JOB = "HELD_FOR_STARVING_JOB"


class FailureReason(str, Enum):
    """The one reason code every FAILED job carries."""

    PENDING_TIMEOUT = "PENDING_TIMEOUT"
    CAPACITY_ERROR = "CAPACITY_ERROR"
    PREEMPTION_LIMIT = "PREEMPTION_LIMIT"
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    CANCELLED = "CANCELLED"


class PreemptionKind(str, Enum):
    CROSS_SHARE = "CROSS_SHARE"
    IN_SHARE = "IN_SHARE"


class AlertKind(str, Enum):
    STARVING = "STARVING"
    PREEMPTED_REPEATEDLY = "PREEMPTED_REPEATEDLY"
    GUARANTEE_VIOLATED = "GUARANTEE_VIOLATED"


@dataclass(frozen=True, slots=True)
class Entry:
    """One item of a preference list: ``count`` instances of ``instance_type``, on a plan or on demand."""

    instance_type: str
    count: int
    training_plan: str | None = None

    def __str__(self) -> str:
        plan = f" on plan {self.training_plan}" if self.training_plan else ""
        return f"{self.count}x {self.instance_type}{plan}"


AIRFLOW_ID_MAX_LENGTH = 250
"""``dag_id``, ``task_id`` and ``run_id``: Airflow's own limit (``ID_LEN`` in ``airflow.models.base``)."""
CLIENT_TOKEN_MAX_LENGTH = 256
"""The operator's tokens are at most 209 characters (``operators.training.client_token``)."""
TRAINING_MAX_BYTES = 64 * 1024
"""The training request (command, environment, a SageMaker CreateTrainingJob request) as
JSON: it is stored with the job and read by every attempt."""
RETRY_ON_MAX_ITEMS = 20
RETRY_PATTERN_MAX_LENGTH = 256
MAX_SECONDS = 10 * 366 * 86400.0
"""The longest duration a job field takes (ten years): a bound, not a policy."""
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
RetryPattern = Annotated[str, Field(strict=True), at_most(RETRY_PATTERN_MAX_LENGTH)]
AirflowId = Annotated[str, Field(strict=True), at_most(AIRFLOW_ID_MAX_LENGTH)]


class PreferenceEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_type: InstanceTypeName
    count: int = Field(ge=1, le=1_000_000, strict=True)
    training_plan: Name | None = None


class JobRequest(BaseModel):
    """A submission: the job fields of docs/model.md rule 2.1 (the table's static rules), each
    bounded (docs/configuration.md, "Limits")."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Name
    share: Name
    priority: int = Field(default=0, ge=0, le=9999, strict=True)
    preferences: list[PreferenceEntry] = Field(min_length=1, json_schema_extra={"maxItems": MAX_PREFERENCES})
    max_pending_seconds: Seconds | None = None
    preemption_retries: int | None = Field(default=None, ge=0, le=1000, strict=True)
    retry_attempts: int = Field(default=1, ge=1, le=10, strict=True)
    retry_on: list[RetryPattern] | None = Field(default=None, max_length=RETRY_ON_MAX_ITEMS)
    checkpoint_uri: Uri | None = None
    checkpoint_interval: Seconds | None = Field(
        default=None, description="seconds of work between checkpoints; estimates lost work"
    )
    wait_for_capacity: bool = False

    @field_validator("preferences")
    @classmethod
    def _types_unique(cls, value: list[PreferenceEntry]) -> list[PreferenceEntry]:
        """At most ``MAX_PREFERENCES`` entries (said in our words, not pydantic's), each type once."""
        if len(value) > MAX_PREFERENCES:
            raise ValueError(too_many_preferences(len(value)))
        seen: set[str] = set()
        for entry in value:
            if entry.instance_type in seen:
                raise ValueError(f"instance type {entry.instance_type} is listed twice; each type at most once")
            seen.add(entry.instance_type)
        return value

    def entries(self) -> tuple[Entry, ...]:
        return tuple(Entry(p.instance_type, p.count, p.training_plan) for p in self.preferences)


class JobFields(BaseModel):
    """What is stored with a submission beside its ``JobRequest``: the backend that runs it,
    what it runs (``training``), its idempotency token and the Airflow task that submitted it.
    Every field is bounded (docs/configuration.md, "Limits") so that no submission, from the CLI or the hook,
    stores more than a few tens of kB; whether the backend exists is the store's rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Name = "local"
    training: dict[str, Any] | None = None
    client_token: Annotated[str, Field(strict=True), at_most(CLIENT_TOKEN_MAX_LENGTH)] | None = None
    dag_id: AirflowId | None = None
    task_id: AirflowId | None = None
    run_id: AirflowId | None = None
    map_index: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)] | None = None
    """The submitting task instance's map index when it is a mapped task (None: not mapped), so
    the Quotas page links to that task instance."""
    aws_conn_id: AirflowId | None = None
    """The Airflow AWS connection whose credentials the sagemaker backend uses for this job's
    calls; None: its share's ``aws_conn_id``, else the quota scheduler's own credentials."""
    expected_runtime_seconds: Seconds | None = None
    """How long the author expects the training to run (the operator's ``expected_runtime``):
    the forecast's best runtime estimate (``core.estimates``). Advice only: no scheduling
    decision reads it, so it is stored beside the request, not in it."""

    @field_validator("training")
    @classmethod
    def _training_stored_as_json(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """The training request is stored as JSON: it must be JSON (no dates, no NaN) and at
        most ``TRAINING_MAX_BYTES`` of it."""
        if value is None:
            return None
        try:
            size = len(json.dumps(value, allow_nan=False, ensure_ascii=False).encode())
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"must be JSON (strings, numbers, lists, mappings): {exc}") from None
        if size > TRAINING_MAX_BYTES:
            raise ValueError(f"at most {TRAINING_MAX_BYTES} bytes as JSON (got {size})")
        return value

    @classmethod
    def keys(cls) -> frozenset[str]:
        """The keys of a job file that are these fields, not the request's."""
        return frozenset(cls.model_fields)


@dataclass(slots=True)
class Placement:
    """Where an attempt runs (or will run once its victims stop)."""

    entry: Entry
    borrowed: int
    placed_at: float
    waiting_for: set[int] = field(default_factory=set)
    """Victims still stopping; capacity is held for the job until this is empty."""
    draining: int = 0
    """Instances of those victims beyond what the job needs: busy until they stop."""


@dataclass(slots=True)
class UsageLine:
    """What a job used of one instance type from one source (a plan, or on demand)."""

    instance_seconds: float = 0.0
    gpu_seconds: float = 0.0
    cost: float = 0.0


@dataclass(slots=True)
class PreemptionRecord:
    at: float
    kind: PreemptionKind
    by: str
    lost_seconds: float


@dataclass(slots=True)
class Job:
    """A job's live record. ``seq`` is its submission order, the final tiebreak everywhere."""

    seq: int
    name: str
    share: str
    priority: int
    entries: tuple[Entry, ...]
    request: JobRequest
    submitted_at: float
    state: JobState = JobState.RUNNABLE
    ref: int | None = None
    """The caller's identifier (the quota database's job id)."""
    failure: FailureReason | None = None
    failure_detail: str | None = None
    runnable_since: float = 0.0
    pending_deadline: float | None = None
    placement: Placement | None = None
    attempts: int = 0
    failed_attempts: int = 0
    preemptions: list[PreemptionRecord] = field(default_factory=list)
    stopping: bool = False
    """Preempted and given its grace period; it no longer counts in its share's usage."""
    stopping_for: int | None = None
    stop_lost: float = 0.0
    running_since: float | None = None
    progress: float = 0.0
    """Work (seconds) saved by checkpoints and carried into the current attempt."""
    wait_seconds: float = 0.0
    starving: bool = False
    alerts: set[AlertKind] = field(default_factory=set)
    last_placement: Entry | None = None
    last_borrowed: int = 0
    """Instances above its share's limit when the last attempt was placed."""
    gpu_seconds: float = 0.0
    usage: dict[tuple[str, str], UsageLine] = field(default_factory=dict)
    """(instance type, plan name or "on-demand") → what the job used of it."""
    lost_gpu_seconds: float = 0.0
    cost: float = 0.0
    fallback_cost: float = 0.0
    past_threshold: bool = False
    """Found past its share's starvation threshold since it last became RUNNABLE (docs/model.md
    rule 8.2): starving, or watched until someone overtakes it."""

    @property
    def key(self) -> tuple[int, float, int]:
        """Order inside a share: priority (high first), first submission, submission order."""
        return (-self.priority, self.submitted_at, self.seq)

    @property
    def instance_types(self) -> frozenset[str]:
        return frozenset(e.instance_type for e in self.entries)

    def entry_on(self, instance_type: str) -> Entry:
        """The job's entry on the type (a list names each type at most once)."""
        return next(e for e in self.entries if e.instance_type == instance_type)

    @property
    def holding(self) -> bool:
        """Counts in its share's usage: placed, or holding capacity for its victims."""
        return self.placement is not None

    def unsaved_work(self, at: float) -> float:
        """Work since the last checkpoint if the attempt were stopped at ``at``.

        Checkpoints fall on multiples of ``checkpoint_interval`` of total work; without an
        interval every second of the attempt is lost (training restarts from zero).
        """
        if self.running_since is None or at <= self.running_since:
            return 0.0
        done = at - self.running_since
        interval = self.request.checkpoint_interval
        if interval is None:
            return done
        return (self.progress + done) % interval


@dataclass(frozen=True, slots=True)
class Decision:
    """Base of what the core tells its driver; every decision says why in ``reason``."""

    at: float
    job: str
    share: str


@dataclass(frozen=True, slots=True)
class Submitted(Decision):
    pass


@dataclass(frozen=True, slots=True)
class Rejected(Decision):
    error: str
    request: str = "submit"


@dataclass(frozen=True, slots=True)
class Placed(Decision):
    entry: Entry
    borrowed: int
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class Preempted(Decision):
    kind: PreemptionKind
    by: str
    lost_seconds: float
    grace_seconds: float
    reason: str


@dataclass(frozen=True, slots=True)
class Requeued(Decision):
    reason: str


@dataclass(frozen=True, slots=True)
class Succeeded(Decision):
    pass


@dataclass(frozen=True, slots=True)
class Failed(Decision):
    reason: FailureReason
    detail: str


@dataclass(frozen=True, slots=True)
class PriorityChanged(Decision):
    old: int
    new: int


@dataclass(frozen=True, slots=True)
class Alert(Decision):
    kind: AlertKind
    reason: str
    position: int | None
    age_seconds: float | None = None
    overtaken_by: int | None = None
    """STARVING: how many placements of later jobs overtook it (docs/model.md rule 8.3)."""
