"""Everything that enters the core, as typed values, and ``handle``: the one way to apply them.

The simulator and the quota scheduler service both drive ``QuotaScheduler`` through ``handle``,
so the two drivers cannot disagree about what an input does or how a refusal is reported: a
refused input changes nothing and yields exactly one ``Rejected`` decision. The service stores
these values in its input log (``service.inputs`` turns them into rows and back), so a new
leader rebuilds the state by handling the same values again.

Jobs are named by the caller's reference (``ref``): the job's id in the quota database for the
service, the order of submission for the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Decision, Job, JobRequest, Rejected
from airflow_quota.exceptions import Refused


@dataclass(frozen=True, slots=True)
class ConfigurationApplied:
    """A configuration version takes effect (docs/model.md rule 5.2)."""

    config: QuotaConfig
    version: int | None = None


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    """SubmitServiceJob: the job joins its share's queue or is rejected."""

    ref: int
    request: JobRequest


@dataclass(frozen=True, slots=True)
class PrioritySet:
    """UpdateServiceJob: a new priority for a live job."""

    ref: int
    priority: int


@dataclass(frozen=True, slots=True)
class JobCancelled:
    """TerminateServiceJob: the job stops for good."""

    ref: int


@dataclass(frozen=True, slots=True)
class AttemptRunning:
    """The backend reports the attempt's training has begun, at ``since``."""

    ref: int
    attempt: int
    since: float


@dataclass(frozen=True, slots=True)
class AttemptSucceeded:
    """The attempt's training finished successfully."""

    ref: int
    attempt: int


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    """The attempt ended by itself with a failure (retried per retry_attempts/retry_on)."""

    ref: int
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class AttemptStopped:
    """A preempted or cancelled attempt has stopped."""

    ref: int
    attempt: int


@dataclass(frozen=True, slots=True)
class CapacityErrorReported:
    """The backend had no capacity for the placed entry; the entry backs off."""

    ref: int
    attempt: int
    backoff_seconds: float


@dataclass(frozen=True, slots=True)
class ProviderAvailability:
    """How many on-demand instances of a type the provider can give (None: unlimited)."""

    instance_type: str
    available: int | None


@dataclass(frozen=True, slots=True)
class CycleDue:
    """Time for a scheduling cycle: something happened, or a timer fell due."""


Input = (
    ConfigurationApplied
    | JobSubmitted
    | PrioritySet
    | JobCancelled
    | AttemptRunning
    | AttemptSucceeded
    | AttemptFailed
    | AttemptStopped
    | CapacityErrorReported
    | ProviderAvailability
    | CycleDue
)
JOB_CHANGES = (PrioritySet, JobCancelled)
"""The inputs a person sends about a live job, which the core may refuse."""


def handle(scheduler: QuotaScheduler, item: Input, at: float) -> list[Decision]:
    """Apply one input at ``at``; the decisions it made. A refusal (a submission the quota
    state rejects, a priority above max_priority, a change to a finished job) changes nothing
    and is reported as one ``Rejected`` decision."""
    try:
        return _apply(scheduler, item, at)
    except Refused as exc:
        return [_rejected(scheduler, item, at, exc)]


def _apply(scheduler: QuotaScheduler, item: Input, at: float) -> list[Decision]:
    match item:
        case CycleDue():
            return scheduler.run_cycle(at)
        case JobSubmitted(ref, request):
            return scheduler.submit(request, at, ref=ref)
        case ConfigurationApplied(config):
            return scheduler.apply_config(config, at)
        case ProviderAvailability(instance_type, available):
            scheduler.set_provider_available(instance_type, available, at)
            return []
        case PrioritySet(ref, priority):
            return scheduler.set_priority(scheduler.by_ref(ref), priority, at)
        case JobCancelled(ref):
            return scheduler.cancel(scheduler.by_ref(ref), at)
        case AttemptRunning(ref, _, since):
            scheduler.job_running(scheduler.by_ref(ref), since)
            return []
        case AttemptSucceeded(ref):
            return scheduler.job_finished(scheduler.by_ref(ref), at, succeeded=True)
        case AttemptFailed(ref, _, reason):
            return scheduler.job_finished(scheduler.by_ref(ref), at, succeeded=False, reason=reason)
        case AttemptStopped(ref):
            return scheduler.victim_stopped(scheduler.by_ref(ref), at)
        case CapacityErrorReported(ref, _, backoff_seconds):
            return scheduler.capacity_error(scheduler.by_ref(ref), at, backoff_seconds)
    raise TypeError(f"not an input of the core: {item!r}")


def _rejected(scheduler: QuotaScheduler, item: Input, at: float, exc: Refused) -> Rejected:
    """The one way a refusal is reported, whichever driver sent the input."""
    if isinstance(item, JobSubmitted):
        return Rejected(at, item.request.name, item.request.share, str(exc))
    if isinstance(item, JOB_CHANGES):
        job: Job = scheduler.by_ref(item.ref)
        request = "set_priority" if isinstance(item, PrioritySet) else "cancel"
        return Rejected(at, job.name, job.share, str(exc), request=request)
    raise exc
