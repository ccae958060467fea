"""What a person asks of the queue (docs/model.md section 7): why a job waits, where it stands, and
what each share holds. Computed by the quota scheduler after it commits (the read model of
``store/views.py`` and the job columns of ``quota_jobs``), never in the cycle's hot path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_quota.core.model import Entry, Job, JobRequest, JobState, PendingReason
from airflow_quota.core.quota import Block, lent_by
from airflow_quota.core.rules import as_its_share_places
from airflow_quota.core.rules.placement import Mode, placement_check
from airflow_quota.core.state import QuotaState


def pending_reason(state: QuotaState, job: Job, now: float) -> tuple[PendingReason, str]:
    """The reason a RUNNABLE job waits and the entry it waits for.

    Quota is looked at first: an entry that quota would allow names what else stops it (a plan
    window, provider capacity, a starving job's reservation); otherwise it waits for quota. The
    rules' own verdict for the job checked as its share places it (``rules.as_its_share_places``).
    """
    if job.placement is not None:
        return PendingReason.WAITING_FOR_VICTIMS, str(job.placement.entry)
    reason, entry = as_its_share_places(job, state, now).reason
    return reason, str(entry)


def queue_position(state: QuotaState, job: Job) -> int:
    """1-based position among every RUNNABLE job of the queue, by priority then first submission."""
    return 1 + sum(int(q.runnable.bisect_left(job.key)) for q in state.queues.values())


def pending_view(state: QuotaState, job: Job, now: float) -> dict[str, Any]:
    """Pending reason, the entry waited for, and positions in the share and in the queue."""
    reason, entry = pending_reason(state, job, now)
    waiting = job.state is JobState.RUNNABLE and not job.stopping
    return {
        "pending_reason": reason.value,
        "waiting_for": entry,
        "position_in_share": state.queues[job.share].position(job.key) if waiting else None,
        "position_in_queue": queue_position(state, job) if waiting else None,
    }


def pending_seconds(runnable_since: float | None, now: float) -> float:
    """How long a job RUNNABLE since ``runnable_since`` has waited at ``now``, to a tenth of a
    second; 0 when nothing waits (None). The one definition of every ``oldest_pending_seconds``
    (CLI, API, Quotas page, metrics): views store the instant, readers call this."""
    return 0.0 if runnable_since is None else round(max(0.0, now - runnable_since), 1)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A share's RUNNABLE jobs: how many, when the longest-waiting became RUNNABLE, and the
    same per instance type a job lists (``(count, oldest)``)."""

    runnable: int
    oldest: float | None
    by_type: dict[str, tuple[int, float]]


def waiting(state: QuotaState, share: str) -> Waiting:
    """One pass over the share's RUNNABLE jobs. It changes only with them (a job becomes
    RUNNABLE when it enters the queue), so a caller may keep it while the queue's ``version``
    stays the same."""
    jobs = state.jobs
    oldest: dict[str, float] = {}
    for key in state.queues[share].runnable:
        job = jobs[key[2]]
        since = job.runnable_since
        for entry in job.entries:
            if since < oldest.get(entry.instance_type, float("inf")):
                oldest[entry.instance_type] = since
    sizes = state.queues[share].sizes
    return Waiting(
        runnable=len(state.queues[share].runnable),
        oldest=min(oldest.values(), default=None),
        by_type={name: (len(sizes[name]), since) for name, since in oldest.items()},
    )


def share_view(state: QuotaState, share: str, waits: Waiting | None = None) -> dict[str, Any]:
    """What a share holds and waits for (docs/model.md rule 7.2): its RUNNABLE and running job
    counts and, per instance type with a limit, usage or demand: capacity, limit, used,
    borrowed, lent, idle, RUNNABLE count, and when the longest-waiting of those jobs became
    RUNNABLE (``oldest_runnable_since``, None when none waits; its age is ``pending_seconds``).

    Instants rather than ages, so the view stays true until the state changes, whenever it is
    read. ``waits``: ``waiting(state, share)`` if the caller kept it."""
    queue = state.queues[share]
    waits = waiting(state, share) if waits is None else waits
    types: dict[str, Any] = {}
    for name, ledger in state.types.items():
        limit = ledger.limit_of(share)
        used = ledger.usage_of(share)
        asking, oldest = waits.by_type.get(name, (0, None))
        if not (limit or used or asking):
            continue
        types[name] = {
            "capacity": ledger.capacity,
            "gpus_per_instance": ledger.gpus,
            "limit": limit,
            "used": used,
            "borrowed": max(0, used - limit),
            "lent": lent_by(ledger).get(share, 0.0),
            "idle": max(0, limit - used),
            "runnable": asking,
            "oldest_runnable_since": oldest,
        }
    return {
        "share": share,
        "running": sum(len(keys) for keys in queue.running.values()),
        "runnable": waits.runnable,
        "oldest_runnable_since": waits.oldest,
        "types": types,
    }


PROBE_SEQ = 1 << 62
"""The submission order of the job ``most_placeable`` imagines: after every real job."""


def most_placeable(state: QuotaState, share: str, entry: Entry, now: float) -> tuple[int, Block | None]:
    """The most instances of ``entry``'s type and source (its plan, or on demand) a new job of
    ``share`` could be placed on now without preempting anyone, and why one more could not.

    The answer is the core's placement check (``placement_check``) for a job at the back of the
    share's queue (priority 0, submitted now): within the share's limit, or up to its borrow
    limit for a share that borrows; starving jobs' reservations, lenders protecting their own
    demand, draining victims, plan windows, back-offs and provider capacity included. A larger
    count is never easier for any rule of the check, so a binary search finds the edge.
    ``entry.count`` is ignored."""
    mode = Mode.BORROW if state.shares[share].borrows else Mode.WITHIN_QUOTA
    probe = Job(
        seq=PROBE_SEQ,
        name="capacity-probe",
        share=share,
        priority=0,
        entries=(entry,),
        request=JobRequest.model_construct(name="capacity-probe", share=share, priority=0, preferences=[]),
        submitted_at=now,
    )

    def block(count: int) -> Block | None:
        sized = Entry(entry.instance_type, count, entry.training_plan)
        probe.entries = (sized,)
        return placement_check(state, probe, sized, mode, now)

    fits, too_many = 0, state.types[entry.instance_type].capacity + 1  # more than the pool never fits
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        if block(middle) is None:
            fits = middle
        else:
            too_many = middle
    return fits, block(too_many)
