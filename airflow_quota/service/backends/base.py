"""The backend interface: the quota scheduler starts, polls and stops *attempts* through it.

An attempt is one placement of a job (docs/model.md rule 6.1). Its ``key`` (job id and attempt
number) is stable across scheduler restarts, so every call is idempotent: starting an attempt
the backend already has does nothing, stopping one twice is harmless, and a scheduler that
restarts after a crash asks ``poll`` what became of the attempts it had started.

Fencing (a leader frozen between its lease check and a call, which it then makes after another
leader took over): a late *stop* is harmless, because a stop is only ever asked for once it is
committed, and no leader takes a committed stop back or starts that key again (a job's next
placement is a new attempt, a new key). A late *start* is not: the next leader may have stopped
the attempt (cancelled, preempted) before anything ran, and the start would then run a training
nobody follows. So a backend that can should keep a *tombstone*: ``stop`` of an attempt it never
heard of records it as stopped before it started (``poll`` then says STOPPED,
``StoppedBeforeStart``), and ``start`` of an attempt it has, tombstone or not, does nothing; the
record of a start and of a tombstone must each be created only if none exists, atomically, so
that of a start and a stop racing from two schedulers one wins whole. The fake and local backends
do; SageMaker cannot (a name is taken only by creating the job), so the poller also checks after
each start whether its leader still wants it, and stops it when not (``service/polling.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

STOPPED_BEFORE_START = "StoppedBeforeStart"
"""The one reason for an attempt stopped (preempted or cancelled) before its training started,
whichever backend and whether or not the backend had heard of it."""


class AttemptStatus(str, Enum):
    UNKNOWN = "UNKNOWN"
    """The backend has never heard of this attempt (it was never started)."""
    PENDING = "PENDING"
    """Started, training not yet running (instances being provisioned)."""
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    """Ended by itself in failure; ``reason`` says why (``ExitCode:N``, SageMaker's FailureReason)."""
    STOPPED = "STOPPED"
    """Ended because it was asked to stop (preempted or cancelled)."""
    CAPACITY_ERROR = "CAPACITY_ERROR"
    """The provider had no capacity for the placed entry: the job goes back to RUNNABLE."""

    @property
    def ended(self) -> bool:
        return self in (
            AttemptStatus.SUCCEEDED,
            AttemptStatus.FAILED,
            AttemptStatus.STOPPED,
            AttemptStatus.CAPACITY_ERROR,
        )


@dataclass(frozen=True)
class AttemptSpec:
    """Everything a backend needs to run one attempt of a job."""

    job_id: int
    job_name: str
    attempt: int
    share: str
    instance_type: str
    count: int
    gpus: int
    """GPUs per instance (catalogue)."""
    training_plan: str | None = None
    training_plan_arn: str | None = None
    checkpoint_uri: str | None = None
    training: dict[str, Any] = field(default_factory=dict)
    """Backend-specific: for ``local`` ``{"command": str | list[str], "env": {...}, "cwd": str}``;
    for ``sagemaker`` a CreateTrainingJob request without the fields the placement fills in."""
    aws_conn_id: str | None = None
    """sagemaker: the Airflow AWS connection whose credentials its calls use (the job's, else
    its share's); None: the backend's own."""

    @property
    def key(self) -> str:
        """Stable identity of the attempt: ``<job id>-<attempt>``."""
        return f"{self.job_id}-{self.attempt}"


@dataclass(frozen=True)
class StartedAttempt:
    """Where a backend runs an attempt, for people, links and results: SageMaker's training job
    name and ARN. Kept with the attempt once its start is done."""

    name: str
    arn: str | None = None


@dataclass(frozen=True)
class AttemptReport:
    status: AttemptStatus
    reason: str | None = None
    running_since: float | None = None
    """When training began (epoch seconds), when the backend knows."""
    ended_at: float | None = None


class Backend(Protocol):
    """What the quota scheduler needs of a place where training runs."""

    name: str
    poll_interval_seconds: float
    """How often the scheduler asks about each open attempt (``service/polling.py``): SageMaker
    30 s, local 1 s, the fake backend 0 (at every step); for a backend that also has
    :class:`ListsChanges`, ten times this is the safety net's period. Optional, read with
    ``getattr``: ``poll_calls_per_second`` (the rate of all its calls), ``calls_per_start`` and
    ``calls_per_stop`` (API calls each costs in that rate, 1 when absent)."""

    def start(self, attempt: AttemptSpec) -> StartedAttempt | None:
        """Start the attempt; does nothing if the backend already has it. Returns where it runs
        when the backend names it (a SageMaker training job), else None."""

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        """What became of the attempt."""

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        """Ask the attempt to stop, giving it ``grace_seconds`` to checkpoint before it is
        killed; ``poll`` reports STOPPED once it is down. Harmless if already stopped; one never
        started is best left a tombstone, that no later ``start`` runs (see above)."""


@dataclass(frozen=True)
class ListedChange:
    """One training job a backend's listing says changed: when, and what the listing shows.

    :param modified_at: when the backend last changed the job (epoch seconds, the backend's clock).
    :param status: what the listing alone shows, when it is enough to tell PENDING from RUNNING;
        None when only a full ``poll`` can tell (an ended job's outcome, a status it cannot map).
    """

    modified_at: float
    status: AttemptStatus | None = None


@dataclass(frozen=True)
class ChangePage:
    """One page of a backend's listing of changed jobs (one API call).

    :param changed: the given attempts whose jobs the page lists, by (job id, attempt number).
    :param next_page: where the listing goes on (opaque to the caller); None: it is complete.
    """

    changed: dict[tuple[int, int], ListedChange]
    next_page: object | None = None


@runtime_checkable
class ListsChanges(Protocol):
    """An optional capability of a :class:`Backend`: it can tell which of many attempts changed
    since a time in one call per page (SageMaker's ListTrainingJobs with LastModifiedTimeAfter,
    100 jobs a page), so the poller need not ask about every attempt once per interval. Checked
    once, with ``isinstance(backend, ListsChanges)``; a backend without it is polled per attempt."""

    list_interval_seconds: float
    """How often the poller lists the changes (well under ``poll_interval_seconds``)."""

    def changed_since(self, attempts: Sequence[AttemptSpec], since: float, page: object | None) -> ChangePage:
        """One page of the attempts among ``attempts`` whose jobs changed after ``since`` (epoch
        seconds); ``page`` is the previous page's ``next_page``, None for the first."""
        ...


class BackendError(Exception):
    """A backend could not do what was asked (a failed API call, a bad training request)."""


class BackendThrottled(BackendError):
    """The provider refused a call because too many were made (AWS ``ThrottlingException`` and
    its kin): the poller pauses every call to that backend with exponential back-off, and makes
    the refused poll, start or stop again after the pause."""
