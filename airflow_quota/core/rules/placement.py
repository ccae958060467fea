"""The placement check (docs/model.md rules 4.0.6, 4.2, 4.3 and 4.4): why an entry cannot be
placed for a job now, in a step's mode, with lender protection (rule 4.3.2) and the borrowing
hold (rule 8.4.2) it rests on.

Plain functions of the state as it stands: nothing is remembered between calls and nothing is
written. The state keeps what these read (the ledgers, queues, sources); the arithmetic of the
invariant lives with the ledger (``quota.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from airflow_quota.core.model import Entry, Job
from airflow_quota.core.queues import BorrowingPlace
from airflow_quota.core.quota import Block, TypeLedger
from airflow_quota.core.state import QuotaState


def borrows(usage: int, count: int, limit: int) -> bool:
    """Whether a share at ``usage`` of a type (its victims removed) borrows by taking ``count``
    more: some of them are above its ``limit`` (docs/model.md rule 4.3.3, ``borrowed`` > 0)."""
    return usage + count > limit


class Mode(Enum):
    """Which rule a placement is checked against (the steps of docs/model.md section 4)."""

    WITHIN_QUOTA = 2
    """U_s + n <= L_s and the invariant holds."""
    BORROW = 3
    """Up to the share's borrow limit; lenders protect types their own RUNNABLE jobs ask for."""
    PREEMPT = 4
    """As BORROW, after removing victims."""


def placement_check(
    state: QuotaState,
    job: Job,
    entry: Entry,
    mode: Mode,
    now: float,
    victims: Iterable[Job] = (),
    idle: int | None = None,
) -> Block | None:
    """Why ``entry`` cannot be placed for ``job`` now in ``mode`` (after removing ``victims``),
    or None: the one check every placing step makes (rules 4.0.6, 4.2, 4.3, 4.4, 8.4). ``idle``
    is ``protected_idle(state, ledger, now)`` of the type when the caller has it already."""
    name, n = entry.instance_type, entry.count
    ledger = state.types[name]
    share = state.shares[job.share]
    if state.queues[job.share].held_back(job.key, name):
        return Block.HELD_FOR_STARVING_JOB
    removed: dict[str, int] = {}
    freed = freed_plan = freed_on_demand = 0
    for victim in victims:
        assert victim.placement is not None
        m = victim.placement.entry.count
        removed[victim.share] = removed.get(victim.share, 0) + m
        freed += m
        if victim.placement.entry.training_plan is None:
            freed_on_demand += m
        elif victim.placement.entry.training_plan == entry.training_plan:
            freed_plan += m
    if share.max_running_jobs is not None and state.holds_its_max(job.share, victims):
        return Block.MAX_RUNNING_JOBS
    own = ledger.usage_of(job.share) - removed.get(job.share, 0)
    limit = ledger.limit_of(job.share)
    if mode is Mode.WITHIN_QUOTA:
        if own + n > limit:
            return Block.SHARE_LIMIT
    else:
        cap = ledger.cap_of(job.share)
        if cap is not None and own + n > cap:
            return Block.BORROW_LIMIT if share.borrows else Block.SHARE_LIMIT
    if ledger.used - freed + ledger.draining + n > ledger.capacity:
        return Block.POOL_FULL
    after_usage = {s: ledger.usage_of(s) - r for s, r in removed.items()}
    after_usage[job.share] = own + n
    delta = sum(ledger.term(s, u) - ledger.term(s, ledger.usage_of(s)) for s, u in after_usage.items())
    before = ledger.pressure
    if before + delta > ledger.capacity and delta > 0:
        return Block.NOT_LENDABLE
    if mode is not Mode.WITHIN_QUOTA and borrows(own, n, limit):
        # lender protection and the borrowing hold bind only a placement that borrows (rules
        # 4.3.2, 4.4, 8.4.2): a reclaim or an in-share swap that leaves its share within its
        # limit uses its guarantee, as a step-2 placement does
        idle = protected_idle(state, ledger, now) if idle is None else idle
        strict_before = before + idle
        strict_after = before + delta + protected_idle(state, ledger, now, after_usage, base=idle)
        if strict_after > ledger.capacity and strict_after > strict_before:
            return Block.NOT_LENDABLE
        if borrowing_held(state, name, job):
            # the last quota rule, so that a job is reported held only when the hold is what
            # stops it: one the pool or the invariant stops anyway waits for quota
            return Block.BORROWING_HELD
    return state.source_block(entry, now, freed_plan, freed_on_demand)


def protected_idle(
    state: QuotaState, ledger: TypeLedger, now: float, usage: dict[str, int] | None = None, base: int | None = None
) -> int:
    """Idle capacity of lenders that protect it (``protects``), with ``usage`` per share
    where given (a placement being checked), else as it is. ``base`` is the figure without
    ``usage`` when the caller has it already: then only the shares in ``usage`` are looked
    at again, not every share with a limit."""
    if not usage:  # only shares below their limit leave any of it idle
        total = 0
        for share in ledger.below_limit:
            total += _protected_idle_of(state, share, ledger, ledger.usage_of(share), now)
        return total
    total = protected_idle(state, ledger, now) if base is None else base
    for share, used in usage.items():
        now_used = ledger.usage_of(share)
        total += _protected_idle_of(state, share, ledger, used, now) - _protected_idle_of(
            state, share, ledger, now_used, now
        )
    return total


def _protected_idle_of(state: QuotaState, share: str, ledger: TypeLedger, used: int, now: float) -> int:
    """What one share keeps idle of the type by protecting it, at ``used``: its idle
    limit if it lends and ``protects``, else nothing."""
    limit = ledger.limits.get(share)
    if limit is None or used >= limit or not ledger.lends.get(share, True):
        return 0
    return limit - used if protects(state, share, ledger, used, now) else 0


def protects(state: QuotaState, share: str, ledger: TypeLedger, usage: int, now: float) -> bool:
    """Lender protection (docs/model.md rule 4.3.2): a share lends none of its idle
    capacity of the type while one of its RUNNABLE jobs has an entry on it that fits under
    its limit at ``usage`` and is not waiting for a plan window or provider capacity (that
    job is about to reclaim), or while a starving job of the share reserves the type.
    Jobs that must borrow the type themselves protect nothing, nor do the jobs of a share
    that holds its ``max_running_jobs`` (rule 4.0.6)."""
    queue = state.queues[share]
    name = ledger.name
    if queue.reserves(name):
        return True
    if state.holds_its_max(share):
        return False  # none of its waiting jobs can start (rule 4.0.6)
    headroom = ledger.limit_of(share) - usage
    smallest = queue.smallest(name)
    if smallest is None or smallest > headroom:
        return False
    if not _source_may_wait(state, ledger, now):
        return True
    for count in sorted(c for c in queue.counts[name] if c <= headroom):
        for key in queue.buckets[(name, count)]:
            entry = state.jobs[key[2]].entry_on(name)
            if state.source_block(entry, now) is None:
                return True
    return False


def _source_may_wait(state: QuotaState, ledger: TypeLedger, now: float) -> bool:
    """Whether some entry on the type could be waiting for its source (a plan, the
    provider, a back-off), so that lender protection must look at each entry."""
    if ledger.available is not None or state.backoff_until.get((ledger.name, None), -1.0) > now:
        return True
    return any(plan.instance_type == ledger.name for plan in state.plans.values())


def borrowing_holder(state: QuotaState, instance_type: str) -> Job | None:
    """The starving job that holds borrowing of the type pool-wide (docs/model.md rule 8.4.2): of
    the shares' reservations with an entry on the type larger than their share's limit
    (which only borrowing can serve), the earliest in borrowing order (``borrowing_place``)."""
    best: Job | None = None
    best_place: BorrowingPlace | None = None
    for name in state.reserving_shares:
        queue = state.queues[name]
        key = queue.holder()
        if key is None:
            continue
        holder = state.jobs[key[2]]
        only_borrowing = instance_type in holder.instance_types and (
            holder.entry_on(instance_type).count > state.types[instance_type].limit_of(name)
        )
        if only_borrowing:
            place = queue.borrowing_place(key)
            if best_place is None or place < best_place:
                best, best_place = holder, place
    return best


def borrowing_held(state: QuotaState, instance_type: str, job: Job) -> bool:
    """Whether a starving job earlier than ``job`` in borrowing order holds borrowing of
    the type: then ``job`` may not place anything that borrows it. Both stand where step 3
    would consider them (``borrowing_place``): a job after the jobs ahead of it in its own
    share, so a holder behind a job of higher priority stands at that job's place, and the
    jobs ahead of the holder in its own share come before it."""
    holder = borrowing_holder(state, instance_type)
    if holder is None or holder is job:
        return False
    place = state.queues[holder.share].borrowing_place(holder.key)
    return place < state.queues[job.share].borrowing_place(job.key)
