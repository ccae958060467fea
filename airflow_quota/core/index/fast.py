"""The fast index: steps 2 to 5 of the scheduling cycle (docs/model.md rules 4.2 to 4.6) over only
the jobs that might fit now, and the working sets the steps hand on.

The full-scan index (``full_scan.py``) is what this one must decide as: every queued job at
every step. The property tests compare the two (``tests/core/test_index_equivalence.py``).

Steps 2, 3 and 4 are one walk each (walk.py) over the jobs that might fit now, driven by a
policy: ``_WithinQuota`` (step 2, share by share), ``_Borrowing`` (step 3, across the
LEND_AND_BORROW shares in FIFO order) and ``_Preemption`` (step 4, share by share). Step 5
fails the CPU-only lists the provider cannot serve.

A job is only looked at when it is new or changed, or when one of its instance types got easier
since the last cycle (capacity freed, a limit raised, a lender no longer protecting, a new
victim): a job that could not fit before and whose types did not change still cannot. While
every instance of the pool is in use (``QuotaState.full``), steps 2 and 3 look at nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from sortedcontainers import SortedList

from airflow_quota.core.index.walk import Bucket, Waited, WalkPolicy, walk
from airflow_quota.core.lifecycle import Lifecycle, queued
from airflow_quota.core.model import Entry, Job
from airflow_quota.core.queues import BorrowingPlace, JobKey, borrowing_place, key_priority
from airflow_quota.core.quota import Block
from airflow_quota.core.rules import Candidate, Preempt, Step, Verdict, Wait, share_order
from airflow_quota.core.rules.placement import protected_idle
from airflow_quota.core.rules.victims import (
    may_preempt_in_share_now,
    most_under_cap,
    within_cap_with_victims,
)
from airflow_quota.core.state import Changes, QuotaState
from airflow_quota.core.steps import Candidates, fail_cpu_only_lists, run_step

BUCKET_BLOCKS = frozenset(
    {Block.HELD_FOR_STARVING_JOB, Block.SHARE_LIMIT, Block.BORROW_LIMIT, Block.POOL_FULL, Block.NOT_LENDABLE}
)
"""Blocks that ``placement_check`` finds before it looks at the entry's source: they depend on
the share, the type and the count (and, for a reservation, on a key every later key shares),
so they hold for every later job of a bucket until something improves the type."""
KeysByShare = dict[str, SortedList]
"""Keys of queued jobs, share by share."""
EntryKey = tuple[str, int, str | None]
"""An entry as step 4's memos remember it: (type, count, training plan or None)."""


def entry_key(entry: Entry) -> EntryKey:
    return (entry.instance_type, entry.count, entry.training_plan)


@dataclass(slots=True)
class CycleWork:
    """The working sets of one cycle, handed from step to step (no step keeps its own)."""

    changes: Changes
    """The state's record of changes, which the steps' own placements and preemptions add to."""
    improved: set[str]
    """Types whose buckets the steps look at: those that got easier before the cycle, then
    those the cycle's own steps made easier (``catch_up``)."""
    changed: set[int]
    """Queued jobs new or changed since the last cycle."""
    changed_keys: KeysByShare
    """Keys of the jobs a placing step tries whatever their types, share by share: the keys
    of ``changed``, and in step 4b those of the jobs queued again since (step 4's victims)."""
    waits: set[int] = field(default_factory=set)
    """Jobs that found no provider capacity for an entry quota allowed: step 5 looks at them."""

    def catch_up(self, placed: bool = False) -> None:
        """Take in the types the cycle's steps made easier so far; with ``placed``, also the
        types of the new placements (new victims for step 4), whose record starts again."""
        self.improved |= self.changes.improved
        if placed:
            self.improved |= self.changes.placed
            self.changes.placed = set()


def place_queued(life: Lifecycle, now: float, work: CycleWork) -> None:
    """Steps 2 to 5 over the jobs that might fit now."""
    state = life.state
    run_step(life, Step.WITHIN_QUOTA, within_quota(state, now, work), now, work.waits)  # 2
    work.catch_up()
    run_step(life, Step.BORROWING, borrowing(state, now, work), now, work.waits)  # 3
    work.catch_up(placed=True)
    preempted = run_step(life, Step.PREEMPTION, preemption(state, now, work), now, work.waits)  # 4
    if any(isinstance(verdict, Preempt) and verdict.victims for verdict in preempted):
        leftovers(life, now, work)  # 4b
    fail_cpu_only_lists(life, now, work.waits)  # 5
    work.catch_up()


def begin(state: QuotaState) -> CycleWork:
    """The cycle's working sets, taken from what changed since the last cycle."""
    changes = state.changes
    changed = {seq for seq in changes.jobs if queued(state.jobs[seq])}
    changes.jobs = set()
    return CycleWork(changes, changes.take_improved(), changed, group_by_share(state, changed))


# -- step 2 -------------------------------------------------------------------------------------


def within_quota(state: QuotaState, now: float, work: CycleWork) -> Candidates:
    """Step 2's candidates: share by share (lowest usage/limit first), each share's jobs in
    queue order that might fit under its share's limit now."""
    if state.full():
        return
    for name in share_order(state, candidate_shares(state, work.improved, work.changed_keys.keys())):
        if name in work.changed_keys or _fits_within_quota(state, name, work.improved):
            policy = _WithinQuota(state, name, work)
            if (yield from walk(state, policy, _changed_of(state, [name], work), policy.active)):
                return


class _WithinQuota(WalkPolicy):
    """Step 2 in one share: queue order; a bucket while its count fits under the share's limit
    and in the free capacity, and no starving job ahead reserves the type."""

    def __init__(self, state: QuotaState, share: str, work: CycleWork) -> None:
        self.state, self.work = state, work
        self.queue = state.queues[share]
        self.shares = (share,)
        self.seen = set()
        self.active = work.improved & self.queue.counts.keys()
        """The types whose buckets joined the walk."""

    def most(self, share: str, instance_type: str) -> float:
        return _within_quota_room(self.state, share, instance_type)

    def keeps(self, bucket: Bucket, job: Job) -> bool:
        # a starving job ahead reserving the type holds back every job after it (held_back is
        # monotone in the key, and that job was passed already in queue order, so stays queued)
        fits = bucket.instances <= self.most(bucket.share, bucket.instance_type)
        return fits and not self.queue.held_back(job.key, bucket.instance_type)

    def exhausted(self) -> bool:
        return self.state.full()

    def look_again(self) -> Iterable[str]:
        # every improved type, not only new ones: a placement that lifts a reservation (a
        # starving job placed, or the share's first starving job now another, reserving other
        # types) lets buckets dropped as held back fit again, from this job on
        improved = self.work.changes.improved & self.queue.counts.keys()
        self.active |= improved
        return improved


# -- step 3 -------------------------------------------------------------------------------------


def borrowing(state: QuotaState, now: float, work: CycleWork) -> Candidates:
    """Step 3's candidates: the LEND_AND_BORROW shares' queued jobs that might fit by borrowing,
    FIFO by first submission across shares, a job only after the jobs ahead of it in its own share."""
    if state.full():
        return
    policy = _Borrowing(state, work)
    yield from walk(state, policy, _changed_of(state, policy.shares, work), work.improved)


class _Borrowing(WalkPolicy):
    """Step 3: FIFO order across the borrowing shares; a bucket while its count fits in the
    free capacity and under the share's borrow limit, and its entry fails for no reason every
    later job of the bucket shares."""

    def __init__(self, state: QuotaState, work: CycleWork) -> None:
        self.state, self.work = state, work
        self.shares = state.borrowing_shares
        self.seen = set()
        self.levels: dict[str, dict[int, tuple[float, int]]] = {}
        """Each share's priority levels at the step's start (``ShareQueue.priority_levels``),
        taken when the walk first orders one of its jobs: only that job's placement could
        change them, so they are still those of the step's start."""

    def order(self, key: JobKey) -> BorrowingPlace:
        """After every job of higher priority in its own share, then by first submission
        (``queues.borrowing_place``, on the priority levels of the step's start)."""
        share = self.state.jobs[key[2]].share
        levels = self.levels.get(share)
        if levels is None:
            levels = self.levels[share] = self.state.queues[share].priority_levels()
        return borrowing_place(levels, key)

    def most(self, share: str, instance_type: str) -> float:
        return self._room(instance_type, share)

    def keeps(self, bucket: Bucket, job: Job) -> bool:
        return bucket.instances <= self._room(bucket.instance_type, bucket.share)

    def keeps_after(self, bucket: Bucket, verdict: Wait) -> bool:
        # lender protection would otherwise fail each job of a long queue one by one
        entries = verdict.job.entries
        for entry, block in zip(entries, verdict.blocks, strict=True):
            if entry.instance_type == bucket.instance_type:
                return block not in BUCKET_BLOCKS
        return True

    def exhausted(self) -> bool:
        return self.state.full()

    def look_again(self) -> Iterable[str]:
        # every improved type, not only new ones: a placement that lifts a lender's protection
        # or a reservation lets buckets dropped as unlendable fit again, from this job on
        return list(self.work.changes.improved)

    def _room(self, instance_type: str, share: str) -> float:
        ledger = self.state.types[instance_type]
        cap = ledger.cap_of(share)
        physical = ledger.capacity - ledger.used - ledger.draining
        return physical if cap is None else min(physical, cap - ledger.usage_of(share))


# -- step 4 -------------------------------------------------------------------------------------


def preemption(state: QuotaState, now: float, work: CycleWork) -> Candidates:
    """Step 4's candidates: jobs still RUNNABLE at its start (not those preempted in it),
    visited as in step 2, that room, reclaim or their own share's jobs might serve, each with
    the entries a victim set might serve. Capacity a preemption frees beyond its need is seen
    by the jobs visited after it."""
    preempted: set[int] = set()
    may_act = _shares_that_may_act(state, work.improved)
    acts: dict[str, bool] = {}  # whether each share acts, as worked out since the last walk

    def share_acts(name: str) -> bool:
        if name not in acts:
            acts[name] = _acts(state, work, name, may_act, now)
        return acts[name]

    if not any(share_acts(name) for name in state.queues):
        return  # most cycles: no share may act, so none needs ordering
    for name in share_order(state, list(state.queues)):
        if share_acts(name):
            policy = _Preemption(state, name, now, work, preempted)
            yield from walk(state, policy, _changed_of(state, [name], work), work.improved & policy.queue.counts.keys())
            if policy.preemptors:  # the walk changed the state
                may_act = _shares_that_may_act(state, work.improved)
                acts.clear()


def _acts(state: QuotaState, work: CycleWork, name: str, may_act: Collection[str] | None, now: float) -> bool:
    """Whether step 4 walks the share now: a new or changed job of it still waits, or it may
    preempt on a type that got easier."""
    if name in work.changed_keys and _still_waits(state, work, name):
        return True
    return (may_act is None or name in may_act) and _may_preempt_in(state, name, work.improved, now)


def _shares_that_may_act(state: QuotaState, improved: set[str]) -> set[str] | frozenset[str] | None:
    """The shares for which ``_may_preempt_in`` might hold, worked out per type rather than
    per share; None for every share. On a type with no instance free, ``room_or_reclaim``
    needs room under the share's limit (only the shares below it have any), and in-share
    preemption a share that allows it."""
    if not improved:
        return frozenset()
    shares: set[str] = set(state.in_share_shares)
    for name in improved:
        ledger = state.types.get(name)
        if ledger is None:
            continue
        if not ledger.full():
            return None
        shares |= ledger.below_limit
    return shares


class _Bound(NamedTuple):
    """What ``_Preemption.most`` worked out for one type of its share."""

    instance_type: str
    reclaim: float
    """``reclaim_bound``: the largest count room or reclaim could serve."""
    lowest_running_priority: int | None
    """``lowest_running_priority``: in-share victims need a higher priority than this."""


class _Preemption(WalkPolicy):
    """Step 4 in one share: queue order; a bucket while room or reclaim could serve its entry,
    and beside the buckets the share's jobs that have waited to preempt in it (``Waited``),
    while the next has a higher priority than the share's lowest running job on the type.
    A job that has not yet waited could only take room or reclaim, so comes only in a bucket."""

    def __init__(self, state: QuotaState, share: str, now: float, work: CycleWork, preempted: set[int]) -> None:
        self.state, self.now, self.work = state, now, work
        self.share = share
        self.queue = self.state.queues[share]
        self.queue.take_patient(now)
        self.shares = (share,)
        self.seen = preempted
        """Preemptors and victims of the whole step: none is visited again in it."""
        self.preemptors = 0
        """Jobs that got capacity in this walk: with none, the walk changed nothing."""
        self.over_cap: set[tuple[str, int]] = set()
        """(type, count) that no later job of the walk could hold under the share's cap, even
        with every candidate of the share gone (``keeps_waited``): its bucket is dropped."""
        self.no_set: set[EntryKey] = set()
        """Entries for which a job offered every candidate found no victim set since the state
        last changed. A later job of the walk asking the same fails too: it has no higher
        priority and a later key, so its candidates are a starting slice of that job's, and
        every hold of the placement check binds it at least as much (``held_back`` grows with
        the key, ``borrowing_held`` with the place in borrowing order). Keyed by the whole
        entry: its source (on demand or a plan) is part of the check."""
        self.no_reclaim: set[EntryKey] = set()
        """The same for jobs still waiting to preempt in the share, offered only the reclaim
        candidates, which are the same for every job of the share: every such job fails too."""
        self.bound = _Bound("", float("-inf"), None)
        """The share's last ``most``: the walk asks ``admits`` for that type's buckets right after,
        nothing changing in between."""

    def most(self, share: str, instance_type: str) -> float:
        # buckets for room and reclaim only: jobs that may find victims in their own share
        # come in the ``Waited`` stream
        bound = reclaim_bound(self.state, share, instance_type, self.now)
        lowest = lowest_running_priority(self.state, share, instance_type)
        self.bound = _Bound(instance_type, bound, lowest)
        return bound

    def admits(self, bucket: Bucket, first: JobKey) -> bool:
        # room_or_reclaim, read off the bound ``most`` has just worked out for the type
        instance_type = bucket.instance_type
        if self.queue.held_back(first, instance_type):
            return False
        if self.bound.instance_type != instance_type:
            return room_or_reclaim(self.state, self.share, instance_type, bucket.instances, self.now)
        return bucket.instances <= self.bound.reclaim

    def keeps(self, bucket: Bucket, job: Job) -> bool:
        # the jobs further down the bucket have no higher priority: none finds victims for the
        # bucket's entry once one has not, when every entry of the type draws on one source
        # (``no_set``); room and reclaim are the same for all
        asked = (bucket.instance_type, bucket.instances)
        on_demand = (*asked, None)
        if asked in self.over_cap or (on_demand in self.no_set and not self._plans_of(bucket.instance_type)):
            return False
        if self.queue.held_back(job.key, bucket.instance_type):
            return False
        return room_or_reclaim(self.state, self.share, bucket.instance_type, bucket.instances, self.now)

    def waited(self, share: str, instance_type: str) -> Iterable[tuple[int, SortedList]]:
        lowest = self.bound.lowest_running_priority
        if self.bound.instance_type != instance_type or lowest is None:
            return ()
        return waited_streams(self.state, share, instance_type, lowest, self.now)

    def keeps_waited(self, tag: Waited, job: Job) -> bool:
        # the jobs further down have no higher priority, and are behind the same starving jobs
        if self.queue.held_back(job.key, tag.instance_type):
            return False
        if not may_preempt_in_share(self.state, self.share, tag.instance_type, job):
            return False
        entry = Entry(tag.instance_type, tag.instances)
        if within_cap_with_victims(self.state, job, entry, self.now):
            return True
        self.over_cap.add((tag.instance_type, tag.instances))  # no later job of the walk fits it either
        return False

    def offer(self, job: Job) -> Candidate | None:
        failed = self._failed(job)
        entries = tuple(
            entry
            for entry in job.entries
            if (entry.instance_type, entry.count) not in self.over_cap
            and entry_key(entry) not in self.no_set
            and entry_key(entry) not in failed
            and may_preempt(self.state, self.share, entry.instance_type, entry.count, job, self.now)
        )
        return Candidate(job, entries) if entries else None

    def saw(self, candidate: Candidate, verdict: Verdict) -> None:
        if isinstance(verdict, Preempt):
            self.seen.update(victim.seq for victim, _ in verdict.victims)
            self.preemptors += 1
        elif candidate.entries is not None:
            self._failed(candidate.job).update(entry_key(entry) for entry in candidate.entries)

    def _failed(self, job: Job) -> set[EntryKey]:
        """The entries no later job of the walk offered as many candidates as ``job`` finds
        victims for: ``no_set`` for a job offered every candidate, else ``no_reclaim``."""
        return self.no_set if self._offered_every_candidate(job) else self.no_reclaim

    def _plans_of(self, instance_type: str) -> bool:
        """Whether a training plan offers the type: then its entries draw on two sources."""
        return any(plan.instance_type == instance_type for plan in self.state.plans.values())

    def _offered_every_candidate(self, job: Job) -> bool:
        """Whether the job was offered every victim a later job of the share could be: not so
        for a job still waiting to preempt in its share, when a later one may have waited enough."""
        return not self.state.shares[self.share].in_share_preemption or may_preempt_in_share_now(
            self.state, job, self.now
        )

    def look_again(self) -> Iterable[str]:
        # buckets passed over before may fit now
        self.over_cap.clear()
        self.no_set.clear()
        self.no_reclaim.clear()
        changes = self.work.changes
        self.work.improved |= changes.improved | changes.placed
        return changes.improved & self.queue.counts.keys()


def may_preempt(state: QuotaState, share: str, instance_type: str, count: int, job: Job | None, now: float) -> bool:
    """A necessary condition for a job of ``share`` asking ``count`` of the type to start in
    step 4. It fails for every job after a job it fails for in the same bucket (they have
    no higher priority and are behind the same starving jobs), so a bucket can be dropped."""
    if job is not None and state.queues[share].held_back(job.key, instance_type):
        return False
    if room_or_reclaim(state, share, instance_type, count, now):
        return True
    return job is not None and may_preempt_in_share(state, share, instance_type, job)


def may_preempt_in_share(state: QuotaState, share: str, instance_type: str, job: Job) -> bool:
    """In-share preemption could find a victim for the job: a job of the share with lower
    priority runs on the type. Whether the job has waited long enough to take it is asked
    apart (``may_preempt_in_share_now``; step 4's ``Waited`` stream holds only jobs that have)."""
    lowest = lowest_running_priority(state, share, instance_type)
    return lowest is not None and lowest < job.priority


def lowest_running_priority(state: QuotaState, share: str, instance_type: str) -> int | None:
    """With in-share preemption, the lowest priority of the share's jobs that may be preempted
    on the type (a job of higher priority may find a victim among them); None without."""
    if not state.shares[share].in_share_preemption:
        return None
    running = state.queues[share].running.get(instance_type)
    return running[0][0] if running else None


def waited_streams(
    state: QuotaState, share: str, instance_type: str, lowest: int, now: float
) -> list[tuple[int, SortedList]]:
    """(count, keys) of the share's jobs that have waited to preempt in it, one stream per count
    of the type, whose first job outranks ``lowest`` (the lowest priority of the share's jobs
    running on the type) and could hold the count under the share's cap with every job it
    outranks there gone. A stream whose first job fails either would be dropped at once
    (``keeps_waited``): every job after it fails too."""
    streams = []
    for count, keys in state.queues[share].patient_counts(instance_type):
        priority = key_priority(keys[0])
        if lowest < priority and count <= most_under_cap(state, share, instance_type, priority, now):
            streams.append((count, keys))
    return streams


def room_or_reclaim(state: QuotaState, share: str, instance_type: str, count: int, now: float) -> bool:
    """Room the share could take without victims (the strict check of step 4), or enough
    lent capacity to reclaim."""
    ledger = state.types[instance_type]
    room = ledger.capacity - ledger.used - ledger.draining
    usage, limit = ledger.usage_of(share), ledger.limit_of(share)
    cap = ledger.cap_of(share)
    if room >= count and (cap is None or usage + count <= cap):
        if usage + count <= limit:
            return True
        slack = ledger.capacity - ledger.pressure - protected_idle(state, ledger, now)
        if slack >= usage + count - max(usage, limit):
            return True
    # a victim may free more than its share's excess, so any excess makes reclaim worth a look
    return usage + count <= limit and ledger.borrowed_total > 0


def reclaim_bound(state: QuotaState, share: str, instance_type: str, now: float) -> float:
    """The largest count for which ``room_or_reclaim`` holds (it only gets harder as the count
    grows), worked out once instead of once per count: ``room_or_reclaim(c)`` is ``c <= bound``."""
    ledger = state.types[instance_type]
    usage, limit = ledger.usage_of(share), ledger.limit_of(share)
    cap = ledger.cap_of(share)
    placeable = min(ledger.capacity - ledger.used - ledger.draining, float("inf") if cap is None else cap - usage)
    within = limit - usage
    if placeable > within:  # counts above the limit need slack no lender protects
        slack = ledger.capacity - ledger.pressure - protected_idle(state, ledger, now)
        within = max(within, slack - usage + max(usage, limit))
    without_victims = min(placeable, within)
    by_reclaim = limit - usage if ledger.borrowed_total > 0 else float("-inf")
    return max(without_victims, by_reclaim)


# -- step 4b -------------------------------------------------------------------------------


def leftovers(life: Lifecycle, now: float, work: CycleWork) -> None:
    """Step 4b, after step 4 preempted: steps 2 and 3 once more (step 4's victims included),
    so that capacity freed beyond the preemptors' need does not idle until the next event."""
    state = life.state
    work.changed_keys = group_by_share(state, {seq for seq in work.changes.jobs if queued(state.jobs[seq])})
    work.catch_up()
    run_step(life, Step.WITHIN_QUOTA, within_quota(state, now, work), now, work.waits)
    work.catch_up()
    run_step(life, Step.BORROWING, borrowing(state, now, work), now, work.waits)


# -- helpers -------------------------------------------------------------------------------------


def group_by_share(state: QuotaState, seqs: set[int]) -> KeysByShare:
    """The jobs' keys, share by share."""
    grouped: KeysByShare = {}
    for seq in seqs:
        job = state.jobs[seq]
        grouped.setdefault(job.share, SortedList()).add(job.key)
    return grouped


def candidate_shares(state: QuotaState, improved: set[str], changed_shares: Collection[str]) -> list[str]:
    """Shares with a new or changed job, or below their limit on a type that got easier and
    with a queue on it (only room under the limit lets a job in within quota)."""
    below = state.below_limit(improved)
    return [
        name
        for name, queue in state.queues.items()
        if name in changed_shares or (name in below and not improved.isdisjoint(queue.counts))
    ]


def _still_waits(state: QuotaState, work: CycleWork, share: str) -> bool:
    """Whether a job of the share new or changed since the last cycle is still queued: most
    were placed by steps 2 and 3, and a walk of jobs all placed would try none."""
    keys = work.changed_keys.get(share)
    if keys:
        jobs = state.jobs
        for key in keys:
            if queued(jobs[key[2]]):
                return True
    return False


def _may_preempt_in(state: QuotaState, share: str, improved: set[str], now: float) -> bool:
    """Whether some waiting job of the share asks for an improved type in a count for which
    ``may_preempt`` might hold: otherwise step 4 would admit none of the share's buckets and
    has nothing to look at in it. ``room_or_reclaim`` only gets harder as the count grows, so
    the smallest count the share asks of the type decides; in-share preemption needs a
    ``Waited`` stream that step 4 would walk (``waited_streams``)."""
    queue = state.queues[share]
    in_share = state.shares[share].in_share_preemption
    if in_share:
        queue.take_patient(now)
    for instance_type in improved:
        if instance_type not in queue.counts:
            continue
        smallest = queue.smallest(instance_type)
        if smallest is None:
            continue
        if room_or_reclaim(state, share, instance_type, smallest, now):
            return True
        if in_share and (patient := queue.patient.get(instance_type)):
            lowest = lowest_running_priority(state, share, instance_type)
            if (
                lowest is not None
                and lowest < key_priority(patient[0])
                and waited_streams(state, share, instance_type, lowest, now)
            ):
                return True
    return False


def _changed_of(state: QuotaState, shares: Iterable[str], work: CycleWork) -> list[tuple[str, SortedList]]:
    """(share, keys) of the jobs a placing step tries whatever their types, for the shares one
    of whose jobs is still queued (a stream of jobs all placed already would try none)."""
    return [(name, work.changed_keys[name]) for name in shares if _still_waits(state, work, name)]


def _within_quota_room(state: QuotaState, share: str, instance_type: str) -> int:
    """The most instances of the type a job of ``share`` could get within quota now."""
    ledger = state.types[instance_type]
    room = ledger.capacity - ledger.used - ledger.draining
    return min(ledger.limit_of(share) - ledger.usage_of(share), room)


def _fits_within_quota(state: QuotaState, share: str, improved: set[str]) -> bool:
    """Whether some waiting job of the share asks for an improved type in a count that fits
    within quota now: otherwise step 2 has nothing to look at in this share."""
    queue = state.queues[share]
    for instance_type in improved:
        if instance_type not in queue.counts:
            continue
        smallest = queue.smallest(instance_type)
        if smallest is not None and smallest <= _within_quota_room(state, share, instance_type):
            return True
    return False
