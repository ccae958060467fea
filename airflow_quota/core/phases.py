"""Steps 2 to 5 of the scheduling cycle (quota-model.md 4), each a walk over the jobs that might
fit now, in the order the spec gives, that places, preempts or fails them through the lifecycle.

A job is only looked at when it is new or changed, or when one of its instance types got easier
since the last cycle (capacity freed, a limit raised, a lender no longer protecting, a new
victim): a job that could not fit before and whose types did not change still cannot. Buckets
(share, type, count) are dropped as soon as their jobs can no longer fit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from sortedcontainers import SortedList

from airflow_quota.core.lifecycle import Lifecycle
from airflow_quota.core.model import Entry, FailureReason, Job
from airflow_quota.core.preempt import find_victims
from airflow_quota.core.queues import JobKey, MergedStreams
from airflow_quota.core.quota import Block, holding_cap
from airflow_quota.core.snapshot import Mode, Snapshot

CAPACITY_BLOCKS = (Block.NO_PROVIDER_CAPACITY, Block.PLAN_FULL, Block.BACKING_OFF)
BUCKET_BLOCKS = frozenset(
    {Block.HELD_FOR_STARVING, Block.SHARE_LIMIT, Block.BORROW_LIMIT, Block.POOL_FULL, Block.NOT_LENDABLE}
)
"""Blocks that ``Snapshot.check`` finds before it looks at the entry's source: they depend on
the share, the type and the count (and, for a reservation, on a key every later key shares),
so they hold for every later job of a bucket until something improves the type."""
SOURCE_BLOCKS = (*CAPACITY_BLOCKS, Block.PLAN_NOT_ACTIVE)
JOBS = "jobs"
"""The first item of the tag of a stream of new or changed jobs: (JOBS, share)."""
Dirty = dict[str, SortedList]
"""Keys of new or changed queued jobs, share by share."""


def share_order(snap: Snapshot, names: Collection[str]) -> list[str]:
    """Shares by usage/limit in instances (lowest first), then name."""
    return sorted(names, key=lambda name: (snap.share_usage[name] / snap.share_limit[name], name))


def group_by_share(snap: Snapshot, dirty: set[int]) -> Dirty:
    grouped: Dirty = {}
    for seq in dirty:
        job = snap.jobs[seq]
        grouped.setdefault(job.share, SortedList()).add(job.key)
    return grouped


def candidate_shares(snap: Snapshot, improved: set[str], dirty_shares: Collection[str]) -> list[str]:
    """Shares with a new or changed job, or a queue on a type that got easier."""
    return [
        name for name, queue in snap.queues.items() if name in dirty_shares or not improved.isdisjoint(queue.counts)
    ]


def within_quota(life: Lifecycle, now: float, improved: set[str], dirty: Dirty, waits: set[int]) -> None:
    """Step 2: share by share (lowest usage/limit first), each job in order takes the first
    entry that fits under its share's limit with the invariant holding. It borrows nothing."""
    snap = life.snapshot
    for name in share_order(snap, candidate_shares(snap, improved, dirty.keys())):
        if name in dirty or _fits_within_quota(snap, name, improved):
            _within_quota_of(life, name, now, improved, dirty, waits)


def _within_quota_room(snap: Snapshot, share: str, instance_type: str) -> int:
    """The most instances of the type a job of ``share`` could get within quota now."""
    ledger = snap.types[instance_type]
    room = ledger.capacity - ledger.used - ledger.draining
    return min(ledger.limit_of(share) - ledger.usage_of(share), room)


def _fits_within_quota(snap: Snapshot, share: str, improved: set[str]) -> bool:
    """Whether some waiting job of the share asks for an improved type in a count that fits
    within quota now: otherwise step 2 has nothing to look at in this share."""
    queue = snap.queues[share]
    for instance_type in improved & queue.counts.keys():
        smallest = queue.smallest(instance_type)
        if smallest is not None and smallest <= _within_quota_room(snap, share, instance_type):
            return True
    return False


def _within_quota_of(life: Lifecycle, name: str, now: float, improved: set[str], dirty: Dirty, waits: set[int]) -> None:
    snap = life.snapshot
    queue = snap.queues[name]
    streams = MergedStreams(_identity)
    if name in dirty:
        streams.add(dirty[name], (JOBS, name))
    active: set[str] = set()

    def bound(instance_type: str) -> int:
        return _within_quota_room(snap, name, instance_type)

    def add_type(instance_type: str, after: Any = None) -> None:
        active.add(instance_type)
        limit = bound(instance_type)
        for count in queue.counts[instance_type]:
            bucket = queue.buckets[(instance_type, count)]
            if bucket and count <= limit:
                streams.add(bucket, (instance_type, count), after)

    def newly_improved(position: Any) -> None:
        # a starving job placed lifts its reservation for the jobs behind it
        for instance_type in (snap.improved & queue.counts.keys()) - active:
            add_type(instance_type, position)

    def keep(tag: Any, key: JobKey) -> bool:
        return tag[1] <= bound(tag[0]) and not queue.held_back(key, tag[0])

    for instance_type in improved & queue.counts.keys():
        add_type(instance_type)
    _drain(life, streams, Mode.WITHIN_QUOTA, now, waits, keep, newly_improved)


def borrowing(life: Lifecycle, now: float, improved: set[str], dirty: Dirty, waits: set[int]) -> None:
    """Step 3: LEND_AND_BORROW shares' remaining jobs, FIFO by first submission across
    shares, a job only after the jobs ahead of it in its own share."""
    snap = life.snapshot
    lenders_of = [n for n, s in snap.shares.items() if s.borrows]
    holders = {name: snap.queues[name].priority_levels() for name in lenders_of}

    def order(key: JobKey) -> tuple[float, int, JobKey]:
        before = holders[snap.jobs[key[2]].share].get(key[0], (float("-inf"), 0))
        holder = max(before, (key[1], key[2]))
        return (holder[0], holder[1], key)

    def room(instance_type: str, share: str) -> float:
        ledger = snap.types[instance_type]
        cap = holding_cap(snap.shares[share], ledger.limit_of(share))
        physical = ledger.capacity - ledger.used - ledger.draining
        return physical if cap is None else min(physical, cap - ledger.usage_of(share))

    streams = MergedStreams(order)
    dirty_shares = dirty.keys()
    active: set[str] = set(improved)

    def add_type(instance_type: str, after: Any = None) -> None:
        for name in lenders_of:
            queue = snap.queues[name]
            for count in queue.counts.get(instance_type, ()):
                bucket = queue.buckets[(instance_type, count)]
                if bucket and count <= room(instance_type, name):
                    streams.add(bucket, (instance_type, count, name), after)

    for name in lenders_of:
        if name in dirty_shares:
            streams.add(dirty[name], (JOBS, name))
    for instance_type in improved:
        add_type(instance_type)

    def newly_improved(position: Any) -> None:
        # every improved type, not only new ones: a placement that lifts a lender's protection
        # or a reservation lets buckets dropped as unlendable fit again, from this job on
        for instance_type in list(snap.improved):
            active.add(instance_type)
            add_type(instance_type, position)

    def keep(tag: Any, key: JobKey) -> bool:
        """Room, and a check of the bucket's entry that fails for a reason shared by every
        job after ``key`` in the bucket (reservation, limits, pool, lendable capacity):
        lender protection would otherwise fail each job of a long queue one by one."""
        if tag[1] > room(tag[0], tag[2]):
            return False
        block = snap.check(snap.jobs[key[2]], Entry(tag[0], tag[1]), Mode.BORROW, now)
        return block not in BUCKET_BLOCKS

    _drain(life, streams, Mode.BORROW, now, waits, keep, newly_improved)


def _drain(
    life: Lifecycle,
    streams: MergedStreams,
    mode: Mode,
    now: float,
    waits: set[int],
    keep: Callable[[Any, JobKey], bool],
    after_placement: Callable[[Any], None] | None = None,
) -> None:
    """Try each job the streams give, in their order; drop a bucket once it cannot fit.

    ``keep(tag, key)`` says whether the bucket's jobs from ``key`` on may still fit: a count
    above the room, or a starving job ahead in the share reserving the type (held_back is
    monotone in the key, and that starving job was passed already in this phase's order, so
    it stays unplaced), fails every job after ``key`` in the bucket too."""
    snap = life.snapshot
    while (item := streams.pop()) is not None:
        key, tag, position = item
        job = snap.jobs[key[2]]
        if tag[0] != JOBS and not keep(tag, key):
            streams.drop(tag)
            continue
        streams.seen.add(job.seq)
        if not life.queued(job):
            continue
        if _try_place(life, job, mode, now, waits) and after_placement is not None:
            after_placement(position)


def _try_place(life: Lifecycle, job: Job, mode: Mode, now: float, waits: set[int]) -> bool:
    snap = life.snapshot
    for entry in job.entries:
        block = snap.check(job, entry, mode, now)
        if block is None:
            borrowed = snap.borrowed_by(job.share, entry)
            why = "within its share's limit" if mode is Mode.WITHIN_QUOTA else "borrowing idle capacity"
            life.place(job, entry, borrowed, now, why)
            return True
        if block in CAPACITY_BLOCKS:
            waits.add(job.seq)
    return False


def preemption(life: Lifecycle, now: float, improved: set[str], dirty: Dirty) -> bool:
    """Step 4: jobs still RUNNABLE at its start (not those preempted in it), visited as in
    step 2, try their entries in list order; the first entry for which a victim set exists
    wins. Capacity a preemption frees beyond its need is seen by the jobs visited after it.
    True when anything was preempted (step 4b then runs)."""
    snap = life.snapshot
    preempted: set[int] = set()
    victims = 0
    for name in share_order(snap, list(snap.queues)):
        if name in dirty or not improved.isdisjoint(snap.queues[name].counts):
            victims += _preemption_of(life, name, now, improved, dirty, preempted)
    return victims > 0


def _preemption_of(
    life: Lifecycle, name: str, now: float, improved: set[str], dirty: Dirty, preempted: set[int]
) -> int:
    """Step 4 for one share's queue; returns how many victims it preempted."""
    snap = life.snapshot
    made = 0
    queue = snap.queues[name]
    streams = MergedStreams(_identity)
    streams.seen = preempted
    if name in dirty:
        streams.add(dirty[name], (JOBS, name))

    def add_type(instance_type: str, after: JobKey | None) -> None:
        for count in queue.counts.get(instance_type, ()):
            bucket = queue.buckets[(instance_type, count)]
            if bucket and may_preempt(snap, name, instance_type, count, snap.jobs[bucket[0][2]], now):
                streams.add(bucket, (instance_type, count), after)

    for instance_type in improved & queue.counts.keys():
        add_type(instance_type, None)
    while (item := streams.pop()) is not None:
        key, tag, _ = item
        job = snap.jobs[key[2]]
        if tag[0] != JOBS and not may_preempt(snap, name, tag[0], tag[1], job, now):
            streams.drop(tag)  # jobs further down have no higher priority
            continue
        if not life.queued(job):
            continue
        preempted.add(job.seq)
        for entry in job.entries:
            if not may_preempt(snap, name, entry.instance_type, entry.count, job, now):
                continue
            victims = find_victims(snap, job, entry, now)
            if victims is None:
                continue
            preempted.update(v.seq for v, _ in victims)
            made += len(victims)
            life.preempt(job, entry, victims, now)
            improved |= snap.improved | snap.new_victims
            for instance_type in snap.improved & queue.counts.keys():
                add_type(instance_type, key)  # buckets passed over before may fit now
            break
    return made


def may_preempt(snap: Snapshot, share: str, instance_type: str, count: int, job: Job | None, now: float) -> bool:
    """A necessary condition for a job of ``share`` asking ``count`` of the type to start in
    step 4. It fails for every job after a job it fails for in the same bucket (they have
    no higher priority and are behind the same starving jobs), so a bucket can be dropped."""
    if job is not None and snap.queues[share].held_back(job.key, instance_type):
        return False
    if room_or_reclaim(snap, share, instance_type, count, now):
        return True
    running = snap.queues[share].running.get(instance_type)
    return (
        job is not None
        and snap.shares[share].in_share_preemption
        and running is not None
        and len(running) > 0
        and running[0][0] < job.priority
    )


def room_or_reclaim(snap: Snapshot, share: str, instance_type: str, count: int, now: float) -> bool:
    """Room the share could take without victims (the strict check of step 4), or enough
    lent capacity to reclaim."""
    ledger = snap.types[instance_type]
    room = ledger.capacity - ledger.used - ledger.draining
    usage, limit = ledger.usage_of(share), ledger.limit_of(share)
    cap = holding_cap(snap.shares[share], limit)
    if room >= count and (cap is None or usage + count <= cap):
        if usage + count <= limit:
            return True
        slack = ledger.capacity - ledger.pressure - snap.protected_idle(ledger, now)
        if slack >= usage + count - max(usage, limit):
            return True
    # a victim may free more than its share's excess, so any excess makes reclaim worth a look
    return usage + count <= limit and ledger.borrowed_total > 0


def fail_fast(life: Lifecycle, now: float, waits: set[int]) -> None:
    """Step 5: a CPU-only list that quota allows but the provider cannot serve fails now."""
    snap = life.snapshot
    for seq in sorted(waits):
        job = snap.jobs[seq]
        if not life.queued(job) or job.request.wait_for_capacity:
            continue
        if any(snap.accelerated(e.instance_type) for e in job.entries):
            continue
        snap.dequeue(job)
        life.fail(job, FailureReason.CAPACITY_ERROR, "no provider capacity for a CPU-only list", now)


def _identity(key: JobKey) -> JobKey:
    return key
