"""The quota scheduler core (quota-model.md 4, 5, 6): ``QuotaScheduler`` and its cycle.

``QuotaScheduler`` holds a ``Snapshot`` in memory. Its callers (the simulator, the quota
service) tell it what happened (a submission, a job running or finishing, a victim stopped, a
configuration change) and run a cycle at a given time; every call returns the decisions it made,
each with its reason. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from datetime import datetime, timezone
from fnmatch import fnmatchcase

from airflow_quota.core import phases
from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.guarantees import GuaranteeWatch
from airflow_quota.core.lifecycle import TYPE, Lifecycle, saved_progress
from airflow_quota.core.model import (
    Decision,
    FailureReason,
    Job,
    JobRequest,
    JobState,
    PriorityChanged,
    Requeued,
    Submitted,
    Succeeded,
)
from airflow_quota.core.snapshot import Snapshot
from airflow_quota.core.submission import check_submission
from airflow_quota.exceptions import ChangeRefused

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class QuotaScheduler(Lifecycle):
    """The quota model, driven by events and a time passed in by the caller."""

    def __init__(self, config: QuotaConfig, origin: datetime = EPOCH) -> None:
        super().__init__(Snapshot(config, origin))
        self.cycles = 0
        self._seq = 0
        self._guarantees = GuaranteeWatch()
        self._plan_timers()

    # -- what happened -------------------------------------------------------------------

    def submit(self, request: JobRequest, now: float, ref: int | None = None) -> list[Decision]:
        """Accept a job into its share's queue, or raise SubmissionRejected (nothing stored).

        ``ref`` is the caller's identifier for the job (its id in the quota database), found
        again with ``by_ref``."""
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
        job.ref = ref
        self.snapshot.jobs[job.seq] = job
        if ref is not None:
            self.snapshot.refs[ref] = job.seq
        self.snapshot.live_names[job.name] = job.seq
        self.snapshot.latest_names[job.name] = job.seq
        self.emit(Submitted(now, job.name, job.share))
        self.make_runnable(job, now)
        return self.flush()

    def job(self, name: str) -> Job:
        """The live job of that name, else the latest one of that name."""
        seq = self.snapshot.live_names.get(name) or self.snapshot.latest_names.get(name)
        if seq is None:
            raise KeyError(name)
        return self.snapshot.jobs[seq]

    def by_ref(self, ref: int) -> Job:
        """The job submitted with this ``ref``."""
        return self.snapshot.jobs[self.snapshot.refs[ref]]

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
        self.emit(PriorityChanged(now, job.name, job.share, old, priority))
        return self.flush()

    def cancel(self, job: Job, now: float, detail: str = "cancelled") -> list[Decision]:
        """Stop the job for good (FAILED with CANCELLED); whatever it holds is released."""
        if job.state.is_final:
            raise ChangeRefused(f"job {job.name!r} is already {job.state.value}")
        if job.placement is None and job.state is JobState.RUNNABLE and not job.stopping:
            self.snapshot.dequeue(job)
        elif job.placement is not None:
            self.release(job, now)
        self.fail(job, FailureReason.CANCELLED, detail, now)
        return self.flush()

    def apply_config(self, config: QuotaConfig, now: float) -> list[Decision]:
        """A new configuration takes effect in the next cycle (quota-model.md 5)."""
        self.snapshot.load_config(config, now)
        self._plan_timers()
        return self.flush()

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
        self.release(job, now)
        job.attempts -= 1
        self.snapshot.backoff_until[(entry.instance_type, entry.training_plan)] = now + backoff_seconds
        self.timer(now + backoff_seconds, TYPE, entry.instance_type)
        self.make_runnable(job, now, keep_pending_clock=True)
        return self.flush()

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
        self.release(job, now)
        if succeeded:
            job.state = JobState.SUCCEEDED
            job.progress += done
            self.snapshot.final_jobs_forget(job)
            self.emit(Succeeded(now, job.name, job.share))
            return self.flush()
        job.failed_attempts += 1
        job.progress = saved_progress(job, done, lost=job.unsaved_work(now))
        job.running_since = None
        patterns = job.request.retry_on
        if patterns is not None and not any(fnmatchcase(reason, p) for p in patterns):
            self.fail(job, FailureReason.ATTEMPTS_EXHAUSTED, f"{reason} matches no retry_on pattern", now)
        elif job.failed_attempts >= job.request.retry_attempts:
            self.fail(
                job,
                FailureReason.ATTEMPTS_EXHAUSTED,
                f"{reason}: attempt {job.failed_attempts} of {job.request.retry_attempts} failed",
                now,
            )
        else:
            self.emit(Requeued(now, job.name, job.share, reason))
            self.make_runnable(job, now)
        return self.flush()

    def victim_stopped(self, job: Job, now: float) -> list[Decision]:
        """A preempted job has stopped after its grace period; its preemptor may start."""
        if job.stopping:
            self.victim_down(job, now)
        return self.flush()

    def guarantee_watched(self) -> bool:
        """Whether the guarantee watchdog follows a waiting job into the next cycle. A cycle that
        finds or leaves it so changed what the next cycle alerts on, even when it decided
        nothing: the service logs such a cycle, so a new leader counts the same cycles."""
        return bool(self._guarantees.violating)

    def _plan_timers(self) -> None:
        """A cycle at every plan window's start and end."""
        for plan in self.snapshot.plans.values():
            self.timer(plan.starts_at, TYPE, plan.instance_type)
            self.timer(plan.ends_at, TYPE, plan.instance_type)

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
        4b. leftovers: if step 4 preempted, steps 2 and 3 once more (victims included), so
           capacity freed beyond the preemptors' need does not idle until the next event;
        5. CPU-only lists with no provider capacity fail at once (CAPACITY_ERROR);
        6. a guarantee that stays unmet for two cycles raises GUARANTEE_VIOLATED.

        Only jobs that might fit now are looked at: those whose types got easier since the last
        cycle, and jobs that are new or changed (see phases.py).
        """
        self.cycles += 1
        snap = self.snapshot
        self.fire_timers(now)
        for seq in self._ready:
            held = snap.jobs[seq]
            if held.placement is not None and held.state is JobState.RUNNABLE:
                self.start_held(held, now)
        self._ready = []
        dirty_seqs = {seq for seq in self._dirty_jobs if self.queued(snap.jobs[seq])}
        dirty = phases.group_by_share(snap, dirty_seqs)
        self._dirty_jobs = set()
        improved, snap.improved = snap.improved, set()
        capacity_waits: set[int] = set()
        phases.within_quota(self, now, improved, dirty, capacity_waits)
        improved |= snap.improved
        phases.borrowing(self, now, improved, dirty, capacity_waits)
        improved |= snap.improved | snap.new_victims
        snap.new_victims = set()
        if phases.preemption(self, now, improved, dirty):
            # 4b, leftovers: what the victims freed beyond their preemptors' need is used now
            improved |= snap.improved
            leftovers = phases.group_by_share(snap, {s for s in self._dirty_jobs if self.queued(snap.jobs[s])})
            phases.within_quota(self, now, improved, leftovers, capacity_waits)
            improved |= snap.improved
            phases.borrowing(self, now, improved, leftovers, capacity_waits)
        phases.fail_fast(self, now, capacity_waits)
        improved |= snap.improved
        for seq in dirty_seqs:
            improved |= snap.jobs[seq].instance_types
        self._guarantees.check(self, now, improved)
        return self.flush()
