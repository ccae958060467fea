"""The quota scheduler core: the scheduling cycle of quota-model.md 4 and the changes of 5 and 6.

``QuotaScheduler`` holds a ``Snapshot`` in memory. Its callers (the simulator, the quota
service) tell it what happened (a submission, a job running or finishing, a victim stopped, a
configuration change) and run a cycle at a given time; every call returns the decisions it made,
each with its reason. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from typing import Any

from sortedcontainers import SortedList

from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.model import (
    Alert,
    AlertKind,
    Decision,
    Entry,
    Failed,
    FailureReason,
    Job,
    JobRequest,
    JobState,
    Placed,
    Placement,
    Preempted,
    PreemptionKind,
    PreemptionRecord,
    PriorityChanged,
    Requeued,
    Submitted,
    Succeeded,
)
from airflow_quota.core.preempt import find_victims
from airflow_quota.core.queues import JobKey, MergedStreams, ShareQueue
from airflow_quota.core.quota import Block, holding_cap
from airflow_quota.core.snapshot import Mode, Snapshot
from airflow_quota.core.submission import check_submission
from airflow_quota.exceptions import ChangeRefused

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
CAPACITY_BLOCKS = (Block.NO_PROVIDER_CAPACITY, Block.PLAN_FULL, Block.BACKING_OFF)
SOURCE_BLOCKS = (*CAPACITY_BLOCKS, Block.PLAN_NOT_ACTIVE)
JOBS = "jobs"
"""The first item of the tag of a stream of new or changed jobs: (JOBS, share)."""

# timer kinds
_DEADLINE, _STARVE, _TYPE = 0, 1, 2


class QuotaScheduler:
    """The quota model, driven by events and a time passed in by the caller."""

    def __init__(self, config: QuotaConfig, origin: datetime = EPOCH) -> None:
        self.snapshot = Snapshot(config, origin)
        self.cycles = 0
        self._seq = 0
        self._timers: list[tuple[float, int, int, Any]] = []
        self._timer_seq = 0
        self._dirty_jobs: set[int] = set()
        self._ready: list[int] = []
        self._out: list[Decision] = []
        self._violating: dict[int, tuple[str, int, int]] = {}
        """Jobs found waiting with an entry under their limit: (type, count, cycles seen)."""
        for plan in self.snapshot.plans.values():
            self._timer(plan.starts_at, _TYPE, plan.instance_type)

    # -- what happened -------------------------------------------------------------------

    def submit(self, request: JobRequest, now: float) -> list[Decision]:
        """Accept a job into its share's queue, or raise SubmissionRejected (nothing stored)."""
        check_submission(self.snapshot, request)
        self._seq += 1
        job = Job(
            seq=self._seq,
            name=request.name,
            share=request.share,
            priority=request.priority,
            entries=request.entries(),
            request=request,
            submitted_at=now,
        )
        self.snapshot.jobs[job.seq] = job
        self.snapshot.live_names[job.name] = job.seq
        self._emit(Submitted(now, job.name, job.share))
        self._make_runnable(job, now)
        return self._flush()

    def job(self, name: str) -> Job:
        """The live job of that name, else the latest one of that name."""
        seq = self.snapshot.live_names.get(name)
        if seq is None:
            matches = [j for j in self.snapshot.jobs.values() if j.name == name]
            if not matches:
                raise KeyError(name)
            return matches[-1]
        return self.snapshot.jobs[seq]

    def set_priority(self, job: Job, priority: int, now: float) -> list[Decision]:
        """UpdateServiceJob: takes effect in the next cycle; above max_priority it is refused."""
        share = self.snapshot.shares[job.share]
        if job.state.is_final:
            raise ChangeRefused(f"job {job.name!r} is {job.state.value}; its priority can no longer change")
        if not 0 <= priority <= share.max_priority:
            raise ChangeRefused(
                f"priority {priority} of job {job.name!r} is above share {share.name!r}'s max_priority "
                f"{share.max_priority}"
            )
        old = job.priority
        queue = self.snapshot.queues[job.share]
        queued = job.state is JobState.RUNNABLE and job.placement is None
        running = job.state.holds_capacity and job.placement is not None and not job.stopping
        if queued:
            self.snapshot.dequeue(job)
        if running:
            assert job.placement is not None
            queue.remove_running(job, job.placement.entry.instance_type)
        job.priority = priority
        if queued:
            self.snapshot.enqueue(job)
            self._dirty_jobs.add(job.seq)
        if running:
            assert job.placement is not None
            queue.add_running(job, job.placement.entry.instance_type)
            self.snapshot.improved.add(job.placement.entry.instance_type)
        self._emit(PriorityChanged(now, job.name, job.share, old, priority))
        return self._flush()

    def cancel(self, job: Job, now: float, detail: str = "cancelled") -> list[Decision]:
        """Stop the job for good (FAILED with CANCELLED); whatever it holds is released."""
        if job.state.is_final:
            raise ChangeRefused(f"job {job.name!r} is already {job.state.value}")
        if job.placement is None and job.state is JobState.RUNNABLE and not job.stopping:
            self.snapshot.dequeue(job)
        elif job.placement is not None:
            self._release(job, now)
        self._fail(job, FailureReason.CANCELLED, detail, now)
        return self._flush()

    def apply_config(self, config: QuotaConfig, now: float) -> list[Decision]:
        """A new configuration takes effect in the next cycle (quota-model.md 5)."""
        self.snapshot.load_config(config, now)
        for plan in self.snapshot.plans.values():
            self._timer(plan.starts_at, _TYPE, plan.instance_type)
        return self._flush()

    def set_provider_available(self, instance_type: str, available: int | None, now: float) -> None:
        """How many on-demand instances of a type the provider can give (None: unlimited)."""
        ledger = self.snapshot.types.get(instance_type)
        if ledger is None:
            return
        self.snapshot.meter.touch(ledger, now)
        ledger.available = available
        self.snapshot.improved.add(instance_type)

    def capacity_error(self, job: Job, now: float, backoff_seconds: float) -> list[Decision]:
        """The backend had no capacity for the placed entry: the job is RUNNABLE again and the
        entry is skipped for ``backoff_seconds``; no attempt is consumed."""
        assert job.placement is not None
        entry = job.placement.entry
        self._release(job, now)
        job.attempts -= 1
        self.snapshot.backoff_until[(entry.instance_type, entry.training_plan)] = now + backoff_seconds
        self._timer(now + backoff_seconds, _TYPE, entry.instance_type)
        self._make_runnable(job, now, keep_pending_clock=True)
        return self._flush()

    def job_running(self, job: Job, now: float) -> None:
        """The backend reports training has begun (work counts from now)."""
        if job.state.holds_capacity and not job.stopping:
            job.state = JobState.RUNNING
            job.running_since = now

    def job_finished(self, job: Job, now: float, succeeded: bool, reason: str = "") -> list[Decision]:
        """An attempt ended by itself: success, or a failure retried per retry_attempts/retry_on."""
        if not job.state.holds_capacity or job.stopping:
            return []
        done = now - job.running_since if job.running_since is not None else 0.0
        self._release(job, now)
        if succeeded:
            job.state = JobState.SUCCEEDED
            job.progress += done
            self.snapshot.final_jobs_forget(job)
            self._emit(Succeeded(now, job.name, job.share))
            return self._flush()
        job.failed_attempts += 1
        job.progress = self._saved_progress(job, done, lost=job.unsaved_work(now))
        job.running_since = None
        patterns = job.request.retry_on
        if patterns is not None and not any(fnmatchcase(reason, p) for p in patterns):
            self._fail(job, FailureReason.ATTEMPTS_EXHAUSTED, f"{reason} matches no retry_on pattern", now)
        elif job.failed_attempts >= job.request.retry_attempts:
            self._fail(
                job,
                FailureReason.ATTEMPTS_EXHAUSTED,
                f"{reason}: attempt {job.failed_attempts} of {job.request.retry_attempts} failed",
                now,
            )
        else:
            self._emit(Requeued(now, job.name, job.share, reason))
            self._make_runnable(job, now)
        return self._flush()

    def victim_stopped(self, job: Job, now: float) -> list[Decision]:
        """A preempted job has stopped after its grace period; its preemptor may start."""
        if job.stopping:
            self._victim_down(job, now)
        return self._flush()

    # -- timers --------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        """When the core next needs a cycle (a deadline, a threshold, a window), if ever."""
        return self._timers[0][0] if self._timers else None

    def _timer(self, at: float, kind: int, payload: Any) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (at, self._timer_seq, kind, payload))

    # -- the cycle -----------------------------------------------------------------------

    def run_cycle(self, now: float) -> list[Decision]:
        """One scheduling cycle at ``now``:

        0. timers that fell due: plan windows, protection ends, back-offs mark their type;
           preemptors whose victims have all stopped are placed;
        1. expire: RUNNABLE jobs past max_pending_seconds fail with PENDING_TIMEOUT;
           jobs RUNNABLE for starvation_after_seconds start starving (alert and reservation);
        2. within quota, share by share (lowest usage/limit first), each job in order;
        3. borrowing, across LEND_AND_BORROW shares in FIFO order of first submission;
        4. preemption: reclaim lent capacity, then in-share by priority;
        5. CPU-only lists with no provider capacity fail at once (CAPACITY_ERROR);
        6. a guarantee that stays unmet for two cycles raises GUARANTEE_VIOLATED.

        Only jobs that might fit now are looked at: those whose types got easier since the last
        cycle, and jobs that are new or changed.
        """
        self.cycles += 1
        snap = self.snapshot
        self._fire_timers(now)
        for seq in self._ready:
            held = snap.jobs[seq]
            if held.placement is not None and held.state is JobState.RUNNABLE:
                self._start_held(held, now)
        self._ready = []
        dirty_seqs = {seq for seq in self._dirty_jobs if self._queued(snap.jobs[seq])}
        dirty = self._group_by_share(dirty_seqs)
        self._dirty_jobs = set()
        improved = snap.improved
        snap.improved = set()
        capacity_waits: set[int] = set()
        self._within_quota(now, improved, dirty, capacity_waits)
        improved |= snap.improved
        self._borrowing(now, improved, dirty, capacity_waits)
        improved |= snap.improved
        improved_or_new_victims = improved | snap.new_victims
        snap.new_victims = set()
        self._preemption(now, improved_or_new_victims, dirty)
        improved |= improved_or_new_victims
        self._fail_fast(now, capacity_waits)
        improved |= snap.improved
        for seq in dirty_seqs:
            improved |= snap.jobs[seq].instance_types
        self._check_guarantees(now, improved)
        return self._flush()

    def _fire_timers(self, now: float) -> None:
        snap = self.snapshot
        while self._timers and self._timers[0][0] <= now:
            at, _, kind, payload = heapq.heappop(self._timers)
            if kind == _TYPE:
                snap.improved.add(payload)
                continue
            job = snap.jobs[payload]
            if not self._queued(job):
                continue
            if kind == _DEADLINE and job.pending_deadline == at:
                snap.dequeue(job)
                self._fail(
                    job,
                    FailureReason.PENDING_TIMEOUT,
                    f"RUNNABLE for {job.request.max_pending_seconds:g} s (max_pending_seconds)",
                    now,
                )
            elif kind == _STARVE:
                due = job.runnable_since + snap.shares[job.share].starvation_after_seconds
                if due > now:
                    self._timer(due, _STARVE, job.seq)
                elif not job.starving and due == at:
                    self._start_starving(job, now)

    def _share_order(self, names: list[str]) -> list[str]:
        """Shares by usage/limit in instances (lowest first), then name."""
        snap = self.snapshot

        return sorted(names, key=lambda name: (snap.share_usage[name] / snap.share_limit[name], name))

    def _candidate_shares(self, improved: set[str], dirty_shares: Collection[str]) -> list[str]:
        """Shares with a new or changed job, or a queue on a type that got easier."""
        return [
            name
            for name, queue in self.snapshot.queues.items()
            if name in dirty_shares or not improved.isdisjoint(queue.counts)
        ]

    def _group_by_share(self, dirty: set[int]) -> dict[str, SortedList]:
        """The keys of new or changed queued jobs, share by share."""
        snap = self.snapshot
        grouped: dict[str, SortedList] = {}
        for seq in dirty:
            job = snap.jobs[seq]
            grouped.setdefault(job.share, SortedList()).add(job.key)
        return grouped

    def _within_quota(self, now: float, improved: set[str], dirty: dict[str, SortedList], waits: set[int]) -> None:
        """Step 2: each job takes the first entry that fits under its share's limit."""
        snap = self.snapshot
        dirty_shares = dirty.keys()
        for name in self._share_order(self._candidate_shares(improved, dirty_shares)):
            queue = snap.queues[name]

            def bound(instance_type: str, share: str = name) -> int:
                ledger = snap.types[instance_type]
                room = ledger.capacity - ledger.used - ledger.draining
                return min(ledger.limit_of(share) - ledger.usage_of(share), room)

            streams = MergedStreams(_identity)
            if name in dirty_shares:
                streams.add(dirty[name], (JOBS, name))
            active: set[str] = set()

            def add_type(instance_type: str, after: Any = None, queue: ShareQueue = queue) -> None:
                active.add(instance_type)
                limit = bound(instance_type)
                for count in queue.counts[instance_type]:
                    bucket = queue.buckets[(instance_type, count)]
                    if bucket and count <= limit:
                        streams.add(bucket, (instance_type, count), after)

            def newly_improved(position: Any, queue: ShareQueue = queue) -> None:
                # a starving job placed lifts its reservation for the jobs behind it
                for instance_type in (snap.improved & queue.counts.keys()) - active:
                    add_type(instance_type, position)

            for instance_type in improved & queue.counts.keys():
                add_type(instance_type)
            self._drain(
                streams,
                Mode.WITHIN_QUOTA,
                now,
                waits,
                lambda tag, job: tag[1] <= bound(tag[0]),
                newly_improved,
            )

    def _borrowing(self, now: float, improved: set[str], dirty: dict[str, SortedList], waits: set[int]) -> None:
        """Step 3: LEND_AND_BORROW shares' remaining jobs, FIFO by first submission across
        shares, a job only after the jobs ahead of it in its own share."""
        snap = self.snapshot
        lenders_of = [n for n, s in snap.shares.items() if s.borrows]
        holders = {name: _holder_levels(snap.queues[name].runnable) for name in lenders_of}

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
            for instance_type in snap.improved - active:
                active.add(instance_type)
                add_type(instance_type, position)

        self._drain(streams, Mode.BORROW, now, waits, lambda tag, job: tag[1] <= room(tag[0], tag[2]), newly_improved)

    def _drain(
        self,
        streams: MergedStreams,
        mode: Mode,
        now: float,
        waits: set[int],
        keep: Callable[[Any, Job], bool],
        after_placement: Callable[[Any], None] | None = None,
    ) -> None:
        """Try each job the streams give, in their order; drop a bucket once it cannot fit."""
        snap = self.snapshot
        while (item := streams.pop()) is not None:
            key, tag, position = item
            job = snap.jobs[key[2]]
            if tag[0] != JOBS and not keep(tag, job):
                streams.drop(tag)
                continue
            streams.seen.add(job.seq)
            if not self._queued(job):
                continue
            if self._try_place(job, mode, now, waits) and after_placement is not None:
                after_placement(position)

    def _try_place(self, job: Job, mode: Mode, now: float, waits: set[int]) -> bool:
        snap = self.snapshot
        for entry in job.entries:
            block = snap.check(job, entry, mode, now)
            if block is None:
                ledger = snap.types[entry.instance_type]
                borrowed = max(0, ledger.usage_of(job.share) + entry.count - ledger.limit_of(job.share))
                why = "within its share's limit" if mode is Mode.WITHIN_QUOTA else "borrowing idle capacity"
                self._place(job, entry, borrowed, now, why)
                return True
            if block in CAPACITY_BLOCKS:
                waits.add(job.seq)
        return False

    def _preemption(self, now: float, improved: set[str], dirty: dict[str, SortedList]) -> None:
        """Step 4: jobs still RUNNABLE, visited as in step 2; the first entry for which a
        victim set exists wins. Capacity a preemption frees beyond its need is seen by the
        jobs visited after it."""
        snap = self.snapshot
        preempted: set[int] = set()
        dirty_shares = dirty.keys()
        for name in self._share_order(list(snap.queues)):
            queue = snap.queues[name]
            if name not in dirty_shares and improved.isdisjoint(queue.counts):
                continue
            streams = MergedStreams(_identity)
            streams.seen = preempted
            if name in dirty_shares:
                streams.add(dirty[name], (JOBS, name))

            def add_type(instance_type: str, after: JobKey | None, share: str = name) -> None:
                for count in snap.queues[share].counts.get(instance_type, ()):
                    bucket = snap.queues[share].buckets[(instance_type, count)]
                    if bucket and self._may_preempt(share, instance_type, count, snap.jobs[bucket[0][2]]):
                        streams.add(bucket, (instance_type, count), after)

            for instance_type in improved & queue.counts.keys():
                add_type(instance_type, None)
            while (item := streams.pop()) is not None:
                key, tag, _ = item
                job = snap.jobs[key[2]]
                if tag[0] != JOBS and not self._may_preempt(name, tag[0], tag[1], job):
                    streams.drop(tag)  # jobs further down have no higher priority
                    continue
                if not self._queued(job):
                    continue
                preempted.add(job.seq)
                for entry in job.entries:
                    if not self._may_preempt(name, entry.instance_type, entry.count, job):
                        continue
                    victims = find_victims(snap, job, entry, now)
                    if victims is None:
                        continue
                    preempted.update(v.seq for v, _ in victims)
                    self._preempt(job, entry, victims, now)
                    improved |= snap.improved | snap.new_victims
                    for instance_type in snap.improved & queue.counts.keys():
                        add_type(instance_type, key)  # buckets passed over before may fit now
                    break

    def _may_preempt(self, share: str, instance_type: str, count: int, job: Job | None) -> bool:
        """A necessary condition for a job of ``share`` asking ``count`` of the type to start in
        step 4. It fails for every job after a job it fails for in the same bucket (they have
        no higher priority and are behind the same starving jobs), so a bucket can be dropped."""
        if job is not None and self.snapshot.queues[share].held_back(job.key, instance_type):
            return False
        if self._room_or_reclaim(share, instance_type, count):
            return True
        running = self.snapshot.queues[share].running.get(instance_type)
        return (
            job is not None
            and self.snapshot.shares[share].in_share_preemption
            and running is not None
            and len(running) > 0
            and running[0][0] < job.priority
        )

    def _room_or_reclaim(self, share: str, instance_type: str, count: int) -> bool:
        """Room the share could take without victims (the strict check of step 4), or enough
        lent capacity to reclaim."""
        snap = self.snapshot
        ledger = snap.types[instance_type]
        room = ledger.capacity - ledger.used - ledger.draining
        usage, limit = ledger.usage_of(share), ledger.limit_of(share)
        cap = holding_cap(snap.shares[share], limit)
        if room >= count and (cap is None or usage + count <= cap):
            if usage + count <= limit:
                return True
            slack = ledger.capacity - ledger.pressure - snap.protected_idle(ledger)
            if slack >= usage + count - max(usage, limit):
                return True
        # a victim may free more than its share's excess, so any excess makes reclaim worth a look
        return usage + count <= limit and ledger.borrowed_total > 0

    def _fail_fast(self, now: float, waits: set[int]) -> None:
        """Step 5: a CPU-only list that quota allows but the provider cannot serve fails now."""
        snap = self.snapshot
        for seq in sorted(waits):
            job = snap.jobs[seq]
            if not self._queued(job) or job.request.wait_for_capacity:
                continue
            if any(snap.accelerated(e.instance_type) for e in job.entries):
                continue
            snap.dequeue(job)
            self._fail(job, FailureReason.CAPACITY_ERROR, "no provider capacity for a CPU-only list", now)

    def _check_guarantees(self, now: float, types: set[str]) -> None:
        """Step 6: a RUNNABLE job with an entry under its share's limit must not keep waiting
        unless for a plan window, provider capacity, a starving job, or victims (stopping or
        protected). Looked at where something changed, and for jobs already found waiting."""
        snap = self.snapshot
        suspects: dict[int, tuple[str, int]] = {}
        for seq, (instance_type, count, _) in self._violating.items():
            suspects[seq] = (instance_type, count)
        for name, queue in snap.queues.items():
            for instance_type in types & queue.counts.keys():
                headroom = snap.types[instance_type].limit_of(name) - snap.types[instance_type].usage_of(name)
                if headroom <= 0:
                    continue
                for count in queue.counts[instance_type]:
                    if count <= headroom:
                        for key in queue.buckets[(instance_type, count)]:
                            if queue.held_back(key, instance_type):
                                break  # so are all the jobs behind it
                            suspects.setdefault(key[2], (instance_type, count))
        still: dict[int, tuple[str, int, int]] = {}
        for seq, (instance_type, count) in sorted(suspects.items()):
            job = snap.jobs[seq]
            ledger = snap.types[instance_type]
            fits = ledger.usage_of(job.share) + count <= ledger.limit_of(job.share)
            if not self._queued(job) or not fits or self._excused(job, instance_type, count, now):
                continue
            cycles = self._violating.get(seq, (instance_type, count, 0))[2] + 1
            still[seq] = (instance_type, count, cycles)
            if cycles >= 2 and AlertKind.GUARANTEE_VIOLATED not in job.alerts:
                self._alert(
                    job,
                    AlertKind.GUARANTEE_VIOLATED,
                    f"{count}x {instance_type} fits under the limit but the job still waits",
                    now,
                )
        self._violating = still

    def _excused(self, job: Job, instance_type: str, count: int, now: float) -> bool:
        snap = self.snapshot
        entry = next(e for e in job.entries if e.instance_type == instance_type)
        block = snap.check(job, entry, Mode.WITHIN_QUOTA, now)
        if block in (*SOURCE_BLOCKS, Block.HELD_FOR_STARVING):
            return True
        ledger = snap.types[instance_type]
        if ledger.draining > 0:
            return True
        for other, usage in ledger.usage.items():
            if usage > ledger.limit_of(other):
                for key in snap.queues[other].running.get(instance_type, ()):
                    victim = snap.jobs[-key[3]]
                    protection = snap.shares[other].preemption_protection_seconds
                    if now - victim.placement.placed_at < protection:  # type: ignore[union-attr]
                        return True
        return False

    # -- carrying decisions out ----------------------------------------------------------

    def _queued(self, job: Job) -> bool:
        return job.state is JobState.RUNNABLE and job.placement is None and not job.stopping

    def _make_runnable(self, job: Job, now: float, keep_pending_clock: bool = False) -> None:
        snap = self.snapshot
        job.state = JobState.RUNNABLE
        job.placement = None
        job.stopping = False
        job.starving = False
        job.running_since = None
        job.runnable_since = now
        max_pending = job.request.max_pending_seconds
        if max_pending is not None and not (keep_pending_clock and job.pending_deadline is not None):
            start = now
            if all(e.training_plan for e in job.entries):
                start = max(now, min(snap.plans[e.training_plan].starts_at for e in job.entries if e.training_plan))
            job.pending_deadline = start + max_pending
        if job.pending_deadline is not None:
            self._timer(job.pending_deadline, _DEADLINE, job.seq)
        self._timer(now + snap.shares[job.share].starvation_after_seconds, _STARVE, job.seq)
        snap.enqueue(job)
        self._dirty_jobs.add(job.seq)

    def _place(self, job: Job, entry: Entry, borrowed: int, now: float, why: str) -> None:
        snap = self.snapshot
        snap.dequeue(job)
        job.starving = False
        snap.take(job, entry, now)
        job.placement = Placement(entry, borrowed, now)
        self._start_held(job, now, why)

    def _start_held(self, job: Job, now: float, why: str = "its victims have stopped") -> None:
        """The job's capacity is its own now: SCHEDULED, a new attempt."""
        snap = self.snapshot
        placement = job.placement
        assert placement is not None
        ledger = snap.types[placement.entry.instance_type]
        if placement.draining:
            ledger.draining -= placement.draining
            snap.improved.add(ledger.name)
            placement.draining = 0
        placement.placed_at = now
        job.state = JobState.SCHEDULED
        job.attempts += 1
        job.wait_seconds += now - job.runnable_since
        job.pending_deadline = None
        job.last_placement = placement.entry
        snap.queues[job.share].add_running(job, ledger.name)
        snap.new_victims.add(ledger.name)
        protection = snap.shares[job.share].preemption_protection_seconds
        if protection > 0:
            self._timer(now + protection, _TYPE, ledger.name)
        borrowing = f", borrowing {placement.borrowed}" if placement.borrowed else ""
        self._emit(Placed(now, job.name, job.share, placement.entry, placement.borrowed, job.attempts, why + borrowing))

    def _preempt(self, job: Job, entry: Entry, victims: list[tuple[Job, PreemptionKind]], now: float) -> None:
        snap = self.snapshot
        stopping = 0
        waiting: set[int] = set()
        for victim, kind in victims:
            grace = snap.shares[victim.share].preemption_grace_seconds
            checkpoints = victim.request.checkpoint_interval is not None
            lost = 0.0 if grace > 0 and checkpoints else victim.unsaved_work(now + grace)
            assert victim.placement is not None
            count = victim.placement.entry.count
            victim.lost_gpu_seconds += lost * count * snap.types[victim.placement.entry.instance_type].gpus
            self._release(victim, now)
            victim.stopping = True
            victim.stop_lost = lost
            victim.preemptions.append(PreemptionRecord(now, kind, job.name, lost))
            what = "reclaims lent capacity" if kind is PreemptionKind.CROSS_SHARE else "has higher priority"
            self._emit(
                Preempted(
                    now,
                    victim.name,
                    victim.share,
                    kind,
                    job.name,
                    lost,
                    grace,
                    f"{job.name} ({job.share}, priority {job.priority}) {what} on {entry.instance_type}",
                )
            )
            if len(victim.preemptions) == snap.shares[victim.share].preempted_alert_after:
                self._alert(victim, AlertKind.PREEMPTED_REPEATEDLY, f"preempted {len(victim.preemptions)} times", now)
            if grace > 0:
                waiting.add(victim.seq)
                victim.stopping_for = job.seq
                stopping += count
        ledger = snap.types[entry.instance_type]
        borrowed = max(0, ledger.usage_of(job.share) + entry.count - ledger.limit_of(job.share))
        for victim, _ in victims:
            if victim.seq not in waiting:
                self._victim_down(victim, now)
        why = "after preempting " + ", ".join(v.name for v, _ in victims) if victims else "freed capacity"
        if not waiting:
            self._place(job, entry, borrowed, now, why)
            return
        snap.dequeue(job)
        snap.take(job, entry, now)
        job.placement = Placement(entry, borrowed, now, waiting)
        job.placement.draining = max(0, stopping - entry.count)
        ledger.draining += job.placement.draining

    def _victim_down(self, victim: Job, now: float) -> None:
        """A preempted job has stopped: it is RUNNABLE again with its checkpoint, or FAILED."""
        snap = self.snapshot
        lost = victim.stop_lost
        done = now - victim.running_since if victim.running_since is not None else 0.0
        victim.progress = self._saved_progress(victim, done, lost)
        preemptor_seq = victim.stopping_for
        victim.stopping = False
        victim.stopping_for = None
        retries = victim.request.preemption_retries
        if retries is not None and len(victim.preemptions) > retries:
            self._fail(victim, FailureReason.PREEMPTION_LIMIT, f"preempted {len(victim.preemptions)} times", now)
        else:
            self._make_runnable(victim, now)
        if preemptor_seq is not None:
            preemptor = snap.jobs[preemptor_seq]
            if preemptor.placement is not None and victim.seq in preemptor.placement.waiting_for:
                preemptor.placement.waiting_for.discard(victim.seq)
                if not preemptor.placement.waiting_for:
                    self._ready.append(preemptor.seq)

    def _saved_progress(self, job: Job, done: float, lost: float) -> float:
        """Work kept after an attempt ends: everything up to the last checkpoint."""
        if job.request.checkpoint_interval is None:
            return 0.0
        return job.progress + done - lost

    def _release(self, job: Job, now: float) -> None:
        self.snapshot.give_back(job, now)

    def _fail(self, job: Job, reason: FailureReason, detail: str, now: float) -> None:
        if job.state is JobState.RUNNABLE and not job.stopping:
            job.wait_seconds += now - job.runnable_since
        job.state = JobState.FAILED
        job.failure = reason
        job.failure_detail = detail
        job.starving = False
        self.snapshot.final_jobs_forget(job)
        self._emit(Failed(now, job.name, job.share, reason, detail))

    def _start_starving(self, job: Job, now: float) -> None:
        snap = self.snapshot
        queue = snap.queues[job.share]
        job.starving = True
        queue.add_starving(job)
        age = now - job.runnable_since
        if AlertKind.STARVING not in job.alerts:
            self._alert(job, AlertKind.STARVING, f"RUNNABLE for {age:g} s", now)

    def _alert(self, job: Job, kind: AlertKind, reason: str, now: float) -> None:
        job.alerts.add(kind)
        queue = self.snapshot.queues[job.share]
        position = queue.position(job.key) if self._queued(job) else None
        self._emit(Alert(now, job.name, job.share, kind, reason, position))

    def _emit(self, decision: Decision) -> None:
        self._out.append(decision)

    def _flush(self) -> list[Decision]:
        out, self._out = self._out, []
        return out


def _identity(key: JobKey) -> JobKey:
    return key


def _holder_levels(runnable: SortedList) -> dict[int, tuple[float, int]]:
    """For each priority level of a share's queue, the latest (first submission, seq) among the
    jobs of higher levels: a job is reached in FIFO order only after all of them."""
    levels: dict[int, tuple[float, int]] = {}
    latest: tuple[float, int] = (float("-inf"), 0)
    index = 0
    while index < len(runnable):
        level = runnable[index][0]
        end = runnable.bisect_left((level + 1,))
        levels[level] = latest
        last = runnable[end - 1]
        latest = max(latest, (last[1], last[2]))
        index = end
    return levels
