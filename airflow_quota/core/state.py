"""The scheduler's live state: configuration, per-type ledgers, plans, queues and jobs, with the
primitive changes (queue, place, release) that keep every index and running sum in step, and
``Changes``, the record of what got easier. The placement check that reads it is a rule
(``core/rules/placement.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from airflow_quota.core.catalogue import InstanceTypeSpec
from airflow_quota.core.config import QuotaConfig, Share, instant_seconds
from airflow_quota.core.measures import Meter, charge
from airflow_quota.core.model import Entry, Job, Placement
from airflow_quota.core.normal_wait import RecentWaits
from airflow_quota.core.overtaking import OvertakeLog
from airflow_quota.core.queues import ShareQueue
from airflow_quota.core.quota import Block, Plan, TypeLedger, holding_caps


@dataclass(slots=True)
class Changes:
    """What changed since the cycle last looked, so that it looks only there: a job that could
    not fit before, and whose types did not get easier since, still cannot (docs/model.md rule 4.0.5).
    The state's primitive changes, the lifecycle and the scheduler's API record here; the
    cycle takes what it needs (``CycleWork``, core/index/fast.py)."""

    improved: set[str] = field(default_factory=set)
    """Types on which something got easier: capacity freed, a limit or the pool changed, a
    lender stopped protecting, a reservation was lifted, a timer fell due."""
    placed: set[str] = field(default_factory=set)
    """Types with a newly placed job: a new candidate victim for reclaim or in-share
    preemption. Only step 4 can gain from a placement; steps 2 and 3 cannot."""
    jobs: set[int] = field(default_factory=set)
    """Jobs new or changed (queued again, a new priority): looked at whatever their types."""

    def take_improved(self) -> set[str]:
        """The improved types recorded so far; from now on, a new record starts."""
        improved, self.improved = self.improved, set()
        return improved


@dataclass(slots=True)
class QuotaState:
    """Everything a cycle reads and changes. ``origin`` is the instant of time 0."""

    config: QuotaConfig
    origin: datetime
    catalogue: dict[str, InstanceTypeSpec] = field(default_factory=dict)
    shares: dict[str, Share] = field(default_factory=dict)
    types: dict[str, TypeLedger] = field(default_factory=dict)
    plans: dict[str, Plan] = field(default_factory=dict)
    queues: dict[str, ShareQueue] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    live_names: dict[str, int] = field(default_factory=dict)
    latest_names: dict[str, int] = field(default_factory=dict)
    """The latest job of each name, live or not."""
    refs: dict[int, int] = field(default_factory=dict)
    """The caller's identifier of a job → its seq."""
    backoff_until: dict[tuple[str, str | None], float] = field(default_factory=dict)
    meter: Meter = field(default_factory=Meter)
    overtakes: OvertakeLog = field(default_factory=OvertakeLog)
    """Who overtook each RUNNABLE job (docs/model.md rule 8.1)."""
    share_usage: dict[str, int] = field(default_factory=dict)
    """Instances each share holds, all types together (for usage/limit ordering)."""
    share_limit: dict[str, int] = field(default_factory=dict)
    borrowing_shares: tuple[str, ...] = ()
    """LEND_AND_BORROW shares, in configuration order: the shares step 3 walks."""
    in_share_shares: frozenset[str] = frozenset()
    """The shares with ``in_share_preemption``."""
    reserving_shares: tuple[str, ...] = ()
    """LEND_AND_BORROW shares whose starving jobs hold reservations: only they can hold
    borrowing pool-wide (none under the defaults, so the check costs nothing then)."""
    changes: Changes = field(default_factory=Changes)
    """What changed since the cycle last looked: every change below records itself there."""
    holding_jobs: dict[str, int] = field(default_factory=dict)
    """How many of each share's jobs hold capacity (placed, or holding it for their victims):
    what ``max_running_jobs`` bounds (docs/model.md rule 4.0.6)."""
    recent_waits: dict[str, RecentWaits] = field(default_factory=dict)
    """Each share's latest waits: what is normal there (docs/model.md rule 8.2)."""

    def __post_init__(self) -> None:
        self.load_config(self.config, 0.0)

    # -- configuration -------------------------------------------------------------------

    def load_config(self, config: QuotaConfig, now: float) -> None:
        """Take a new configuration; usage stays, limits and capacity change (docs/model.md rule 5.2)."""
        for ledger in self.types.values():
            self.meter.touch(ledger, now)
        self.config = config
        self.catalogue = config.catalogue()
        self.shares = {s.name: s for s in config.shares}
        for name, share in self.shares.items():
            queue = self.queues.setdefault(name, ShareQueue())
            if share.starvation_reservation != queue.reserving:
                starving = [job for key in queue.runnable if (job := self.jobs[key[2]]).starving]
                queue.set_reserving(share.starvation_reservation, starving)
            patience = share.in_share_preemption_after_seconds if share.in_share_preemption else None
            if patience != queue.patience:
                queue.set_patience(patience, [self.jobs[key[2]] for key in queue.runnable])
            self.share_usage.setdefault(name, 0)
            self.holding_jobs.setdefault(name, 0)
            self.recent_waits.setdefault(name, RecentWaits())
            self.share_limit[name] = sum(share.capacity_limits.values())
        self.borrowing_shares = tuple(name for name, share in self.shares.items() if share.borrows)
        self.in_share_shares = frozenset(name for name, share in self.shares.items() if share.in_share_preemption)
        self.reserving_shares = tuple(s.name for s in config.shares if s.starvation_reservation and s.borrows)
        names = set(config.pool.capacity) | set(self.types)
        for share in config.shares:
            names |= set(share.capacity_limits)
        for name in names:
            spec = self.catalogue.get(name)
            existing = self.types.get(name)
            if existing is not None:
                ledger = existing
            else:
                ledger = self.types[name] = TypeLedger(name=name, capacity=0, gpus=0, price=0.0, limits={}, lends={})
                self.meter.touch(ledger, now)
            ledger.capacity = config.pool.capacity.get(name, 0)
            ledger.gpus = spec.gpus if spec else 0
            ledger.price = spec.hourly_price if spec else 0.0
            ledger.limits = {s.name: s.capacity_limits[name] for s in config.shares if name in s.capacity_limits}
            ledger.lends = {s.name: s.lends for s in config.shares}
            ledger.caps = holding_caps(config, name)
            ledger.recompute()
        old_plans = self.plans
        self.plans = {}
        for plan in config.pool.training_plans:
            used = old_plans[plan.name].used if plan.name in old_plans else 0
            self.plans[plan.name] = Plan(
                name=plan.name,
                instance_type=plan.instance_type,
                count=plan.count,
                starts_at=instant_seconds(plan.starts_at, self.origin),
                ends_at=instant_seconds(plan.ends_at, self.origin),
                hourly_price=plan.hourly_price,
                used=used,
            )
        self.changes.improved |= set(self.types)

    def accelerated(self, instance_type: str) -> bool:
        spec = self.catalogue.get(instance_type)
        return spec.is_accelerated(instance_type) if spec else False

    # -- the placement check -------------------------------------------------------------

    def full(self) -> bool:
        """Whether every instance of every type is in use or stopping: then ``check`` finds
        ``POOL_FULL`` (or an earlier block) for every entry without victims, so steps 2 and 3
        can place nothing until something frees."""
        return all(ledger.full() for ledger in self.types.values())

    def below_limit(self, types: Iterable[str]) -> set[str]:
        """The shares using less than their limit of one of the types (``TypeLedger.below_limit``)."""
        below: set[str] = set()
        for name in types:
            ledger = self.types.get(name)
            if ledger is not None:
                below |= ledger.below_limit
        return below

    def borrowing_held_types(self) -> set[str]:
        """The types whose borrowing some starving job holds pool-wide (``borrowing_holder``):
        those of the holders' entries larger than their share's limit."""
        held: set[str] = set()
        for name in self.reserving_shares:
            key = self.queues[name].holder()
            if key is not None:
                for entry in self.jobs[key[2]].entries:
                    if entry.count > self.types[entry.instance_type].limit_of(name):
                        held.add(entry.instance_type)
        return held

    def borrowed_by(self, share: str, entry: Entry) -> int:
        """How many of the entry's own instances would be above the share's limit once placed,
        ``max(0, min(n, U_s(T) + n − L_s(T)))`` (docs/model.md rule 4.3.3): never more than n."""
        ledger = self.types[entry.instance_type]
        over = ledger.usage_of(share) + entry.count - ledger.limit_of(share)
        return max(0, min(entry.count, over))

    def protection_changed(self, share: str, ledger: TypeLedger, before: int, after: int) -> bool:
        """Whether the share's usage moving from ``before`` to ``after`` can end its lender
        protection of the type (its smallest waiting job no longer fits)."""
        smallest = self.queues[share].smallest(ledger.name)
        limit = ledger.limit_of(share)
        return smallest is not None and smallest <= limit - before and smallest > limit - after

    def holds_its_max(self, share: str, victims: Iterable[Job] = ()) -> bool:
        """Whether the share holds its ``max_running_jobs`` (docs/model.md rule 4.0.6), its jobs
        among ``victims`` counted as gone."""
        most = self.shares[share].max_running_jobs
        return most is not None and self.holding_jobs[share] - sum(v.share == share for v in victims) >= most

    def backing_off(self, entry: Entry, now: float) -> bool:
        """Whether the entry's source, its plan or its type on demand, is skipped after a
        capacity error (docs/model.md rule 6.5: by every job, until its back-off ends)."""
        return self.backoff_until.get((entry.instance_type, entry.training_plan), -1.0) > now

    def source_block(self, entry: Entry, now: float, freed_plan: int = 0, freed_on_demand: int = 0) -> Block | None:
        """Whether the entry's source (its plan, or the provider on demand) can give it now."""
        if entry.training_plan is not None:
            plan = self.plans[entry.training_plan]
            if not plan.active(now):
                return Block.PLAN_NOT_ACTIVE
            if self.backing_off(entry, now):
                return Block.BACKING_OFF
            if plan.used - freed_plan + entry.count > plan.count:
                return Block.PLAN_FULL
            return None
        if self.backing_off(entry, now):
            return Block.BACKING_OFF
        ledger = self.types[entry.instance_type]
        if ledger.available is not None and ledger.on_demand_used - freed_on_demand + entry.count > ledger.available:
            return Block.NO_PROVIDER_CAPACITY
        return None

    # -- primitive changes ---------------------------------------------------------------

    def enqueue(self, job: Job) -> None:
        """Put a job in its share's queue. A job that comes ahead of its share's holder moves
        the holder later in borrowing order, and a starving one takes its reservation over: the
        types the holder reserved got easier for some jobs (``ShareQueue.add_runnable``)."""
        eased = self.queues[job.share].add_runnable(job)
        if eased:
            self.changes.improved |= eased

    def dequeue(self, job: Job) -> None:
        """Take a job out of its share's queue; types its share may stop protecting become
        lendable, and a starving job's reservation is lifted. The jobs of lower priority of a
        borrowing share move earlier in borrowing order (``borrowing_place``): one held by a
        starving job's borrowing hold may now come before its holder."""
        if job.starving:
            self.changes.improved |= job.instance_types
        self.overtakes.forget(job)
        queue = self.queues[job.share]
        for name in queue.remove_runnable(job):
            ledger = self.types[name]
            headroom = ledger.limit_of(job.share) - ledger.usage_of(job.share)
            smallest = queue.smallest(name)
            if job.entry_on(name).count <= headroom and (smallest is None or smallest > headroom):
                self.changes.improved.add(name)
        if self.reserving_shares and self.shares[job.share].borrows and queue.lower_priority_waits(job.key):
            self.changes.improved |= self.borrowing_held_types()

    def take(self, job: Job, entry: Entry, now: float) -> None:
        """Count ``entry`` in the job's share usage and in its source."""
        ledger = self.types[entry.instance_type]
        self.meter.touch(ledger, now)
        before = ledger.usage_of(job.share)
        ledger.change_usage(job.share, entry.count)
        lends = ledger.lends.get(job.share, True)
        if lends and self.protection_changed(job.share, ledger, before, before + entry.count):
            self.changes.improved.add(entry.instance_type)
        self.share_usage[job.share] += entry.count
        self.holding_jobs[job.share] += 1
        if self.holding_jobs[job.share] == self.shares[job.share].max_running_jobs:
            # the share stops protecting: what it kept idle is lendable (rule 4.0.6)
            self.changes.improved |= self.queues[job.share].counts.keys()
        if entry.training_plan is not None:
            self.plans[entry.training_plan].used += entry.count
        else:
            ledger.on_demand_used += entry.count
        self.changes.placed.add(entry.instance_type)

    def give_back(self, job: Job, now: float) -> Placement:
        """Release what the job holds; the time it held it is charged to the job."""
        placement = job.placement
        assert placement is not None
        entry = placement.entry
        ledger = self.types[entry.instance_type]
        self.meter.touch(ledger, now)
        ledger.change_usage(job.share, -entry.count)
        self.share_usage[job.share] -= entry.count
        self.holding_jobs[job.share] -= 1
        if self.holding_jobs[job.share] + 1 == self.shares[job.share].max_running_jobs:
            # every type the share's queued jobs ask got easier for them, not only this one
            self.changes.improved |= self.queues[job.share].counts.keys()
        ledger.draining -= placement.draining
        placement.draining = 0
        if entry.training_plan is not None:
            plan = self.plans[entry.training_plan]
            plan.used -= entry.count
            price = plan.hourly_price
        else:
            ledger.on_demand_used -= entry.count
            price = ledger.price
        if not placement.waiting_for and job.state.holds_capacity:
            self.queues[job.share].remove_running(job, entry.instance_type)
            charge(job, entry, now - placement.placed_at, ledger.gpus, price)
        job.placement = None
        self.changes.improved.add(entry.instance_type)
        return placement

    def final_jobs_forget(self, job: Job) -> None:
        """A finished job frees its name for a new submission."""
        self.overtakes.drop(job)
        if self.live_names.get(job.name) == job.seq:
            del self.live_names[job.name]
