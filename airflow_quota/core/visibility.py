"""What a person asks of the queue (quota-model.md 7): why a job waits, where it stands, and
what each share holds. Computed on demand, never in the cycle's hot path."""

from __future__ import annotations

from typing import Any

from airflow_quota.core.model import Job, JobState, PendingReason
from airflow_quota.core.quota import Block, lent_by
from airflow_quota.core.state import Mode, QuotaState

_REASONS = {
    Block.PLAN_NOT_ACTIVE: PendingReason.WAITING_FOR_PLAN,
    Block.PLAN_FULL: PendingReason.WAITING_FOR_CAPACITY,
    Block.NO_PROVIDER_CAPACITY: PendingReason.WAITING_FOR_CAPACITY,
    Block.BACKING_OFF: PendingReason.WAITING_FOR_CAPACITY,
    Block.HELD_FOR_STARVING: PendingReason.HELD_FOR_STARVING_JOB,
    Block.BORROWING_HELD: PendingReason.HELD_FOR_STARVING_JOB,
}


def pending_reason(state: QuotaState, job: Job, now: float) -> tuple[PendingReason, str]:
    """The reason a RUNNABLE job waits and the entry it waits for.

    Quota is looked at first: an entry that quota would allow names what else stops it (a plan
    window, provider capacity, a starving job's reservation); otherwise it waits for quota.
    """
    if job.placement is not None:
        return PendingReason.WAITING_FOR_VICTIMS, str(job.placement.entry)
    share = state.shares[job.share]
    mode = Mode.BORROW if share.borrows else Mode.WITHIN_QUOTA
    for entry in job.entries:
        block = state.check(job, entry, mode, now)
        if block in _REASONS:
            return _REASONS[block], str(entry)
    return PendingReason.WAITING_FOR_QUOTA, str(job.entries[0])


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


def share_view(state: QuotaState, share: str, now: float) -> dict[str, Any]:
    """Per instance type: limit, usage, borrowed, lent, RUNNABLE count, oldest pending age."""
    queue = state.queues[share]
    runnable = [state.jobs[key[2]] for key in queue.runnable]
    types: dict[str, Any] = {}
    for name, ledger in state.types.items():
        lent = lent_by(ledger).get(share, 0.0)
        limit = ledger.limit_of(share)
        usage = ledger.usage_of(share)
        asking = [j for j in runnable if name in j.instance_types]
        if not (limit or usage or asking):
            continue
        types[name] = {
            "limit": limit,
            "usage": usage,
            "borrowed": max(0, usage - limit),
            "lent": lent,
            "idle": max(0, limit - usage),
            "runnable": len(asking),
            "oldest_pending_seconds": max((now - j.runnable_since for j in asking), default=0.0),
        }
    return {"share": share, "runnable": len(runnable), "types": types}
