"""The quota scheduler core (docs/model.md sections 4, 5, 6): ``QuotaScheduler`` and its cycle.

``QuotaScheduler`` holds the live quota state (``QuotaState``) and the ``Lifecycle`` that changes
it. Its callers (the simulator, the quota service) tell it what happened (a submission, a job
running or finishing, a victim stopped, a configuration change) and run a cycle at a given
time; every call returns the decisions it made, each with its reason. Nothing here reads a
clock or does I/O.

Where to start reading: here, ``QuotaScheduler.run_cycle``, whose docstring numbers the steps
of docs/model.md section 4. The core then reads top-down in this order:

1. ``cycle.py``: what happened (the API) and the cycle's steps, in order;
2. ``rules/``: what a placing step does with one job (``assess``: admit, preempt or wait), the
   placement check it rests on (``rules/placement.py``: lender protection, the borrowing hold),
   the orders the steps walk in; no memo, nothing written;
3. ``steps.py``: one placing step, the same for every index: candidates, ``assess``, apply;
   ``index/``: which jobs each step looks at. ``index/full_scan.py`` is every queued job, the
   model taken literally; ``index/fast.py`` (with ``index/walk.py``, its one bucket walk) looks
   only at the jobs that might fit, and must decide exactly as the full scan does;
4. ``lifecycle.py``: how a job changes state (placed, preempted, requeued, failed, starving),
   the timers, and the decisions emitted;
5. ``state.py``: the live state the rules read, and ``Changes``, the record of what got
   easier since the cycle last looked;
6. ``quota.py`` (the invariant's arithmetic per type), ``rules/victims.py`` (the victim oracle),
   ``queues.py`` (the per-share indexes and the merge the walk runs on);
7. ``guarantees.py`` (step 6) and ``overtaking.py`` (when a job starts starving, section 8);
8. the leaves: ``model.py`` (jobs, states, decisions), ``config.py`` and ``catalogue.py`` (the
   configuration), ``submission.py`` (what a submission must satisfy), ``measures.py``,
   ``visibility.py``, ``explain.py`` and ``summary.py`` (what people and files are shown).
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow_quota.core.config import QuotaConfig, Share
from airflow_quota.core.guarantees import GuaranteeWatch
from airflow_quota.core.index import PLACERS, IndexName, fast
from airflow_quota.core.lifecycle import TYPE, Lifecycle, queued
from airflow_quota.core.model import (
    Decision,
    FailureReason,
    Job,
    JobRequest,
    JobState,
    PriorityChanged,
    Submitted,
)
from airflow_quota.core.state import QuotaState
from airflow_quota.core.submission import check_submission
from airflow_quota.exceptions import ChangeRefused

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def finished_refusal(name: str, state: JobState, request: str) -> ChangeRefused:
    """Why a change (``set_priority``, ``cancel``) to a finished job is refused: the one
    wording, whether the core still holds the job or has forgotten it (``forget_finished``)."""
    if request == "cancel":
        return ChangeRefused(f"job {name!r} is already {state.value}")
    return ChangeRefused(f"job {name!r} is {state.value}; its priority can no longer change")


class QuotaScheduler:
    """The quota model, driven by events and a time passed in by the caller."""

    queued = staticmethod(queued)
    """Whether a job waits in its share's queue (``lifecycle.queued``)."""

    index: IndexName = "fast"
    """Which jobs the placing steps look at: ``fast`` (only those that might fit) or
    ``full-scan`` (every queued job: the reference the fast one is tested against). Not part
    of the state: a snapshot does not hold it, and a scheduler may switch at any cycle."""

    def __init__(self, config: QuotaConfig, origin: datetime = EPOCH) -> None:
        self.state = QuotaState(config, origin)
        """The live quota state: configuration, ledgers, queues, jobs."""
        self.lifecycle = Lifecycle(self.state)
        """Moves jobs between states on ``state``, keeps the timers, collects the decisions."""
        self.cycles = 0
        self._seq = 0
        self._guarantees = GuaranteeWatch()
        self._plan_timers()

    def next_timer(self) -> float | None:
        """When the core next needs a cycle (a deadline, a threshold, a window), if ever."""
        return self.lifecycle.next_timer()

    def rescan_next_cycle(self) -> None:
        """Have the next cycle look at every queued job on every type, as a cycle that rescans
        everything would (what the property tests compare the incremental cycle against)."""
        changes = self.state.changes
        changes.improved |= set(self.state.types)
        changes.jobs |= {job.seq for job in self.state.jobs.values() if queued(job)}

    # -- what happened -------------------------------------------------------------------

    def submit(self, request: JobRequest, now: float, ref: int | None = None) -> list[Decision]:
        """Accept a job into its share's queue, or raise SubmissionRejected (nothing stored).

        ``ref`` is the caller's identifier for the job (its id in the quota database), found
        again with ``by_ref``."""
        check_submission(self.state, request)
        self._seq += 1
        job = Job(
            seq=self._seq,
            name=request.name,
            share=request.share,
            priority=request.priority,
            entries=request.entries(),
            request=request,
            submitted_at=now,
            state=JobState.SUBMITTED,
        )
        job.ref = ref
        self.state.jobs[job.seq] = job
        if ref is not None:
            self.state.refs[ref] = job.seq
        self.state.live_names[job.name] = job.seq
        self.state.latest_names[job.name] = job.seq
        self.lifecycle.emit(Submitted(now, job.name, job.share))
        self.lifecycle.make_runnable(job, now)
        return self.lifecycle.flush()

    def job(self, name: str) -> Job:
        """The live job of that name, else the latest one of that name."""
        seq = self.state.live_names.get(name) or self.state.latest_names.get(name)
        if seq is None:
            raise KeyError(name)
        return self.state.jobs[seq]

    def by_ref(self, ref: int) -> Job:
        """The job submitted with this ``ref``."""
        return self.state.jobs[self.state.refs[ref]]

    def set_priority(self, job: Job, priority: int, now: float) -> list[Decision]:
        """UpdateServiceJob: takes effect in the next cycle; above max_priority it is refused."""
        share = self.state.shares[job.share]
        if job.state.is_final:
            raise finished_refusal(job.name, job.state, "set_priority")
        if not 0 <= priority <= share.max_priority:
            raise ChangeRefused(
                f"priority {priority} of job {job.name!r} is above share {share.name!r}'s max_priority "
                f"{share.max_priority}"
            )
        old = job.priority
        queue = self.state.queues[job.share]
        waits = queued(job)
        running = job.state.holds_capacity and job.placement is not None and not job.stopping
        if waits:
            self.state.dequeue(job)
        if running:
            assert job.placement is not None
            queue.remove_running(job, job.placement.entry.instance_type)
        job.priority = priority
        if waits:
            self.state.enqueue(job)
            if job.past_threshold and not job.starving:
                self.state.overtakes.watch(job)  # still past its threshold: the next overtaking makes it starve
            self.state.changes.jobs.add(job.seq)
        if running:
            assert job.placement is not None
            queue.add_running(job, job.placement.entry.instance_type)
            self.state.changes.improved.add(job.placement.entry.instance_type)
        self.lifecycle.emit(PriorityChanged(now, job.name, job.share, old, priority))
        return self.lifecycle.flush()

    def cancel(self, job: Job, now: float, detail: str = "cancelled") -> list[Decision]:
        """Stop the job for good (FAILED with CANCELLED); whatever it holds is released."""
        if job.state.is_final:
            raise finished_refusal(job.name, job.state, "cancel")
        if queued(job):
            self.state.dequeue(job)
        elif job.placement is not None:
            self.lifecycle.release(job, now)
        self.lifecycle.fail(job, FailureReason.CANCELLED, detail, now)
        return self.lifecycle.flush()

    def apply_config(self, config: QuotaConfig, now: float) -> list[Decision]:
        """A new configuration takes effect in the next cycle (docs/model.md rule 5.2). A changed
        wait before in-share preemption, or a changed starvation threshold, applies to the jobs
        already waiting, counted from when they became RUNNABLE."""
        thresholds = {name: _threshold_settings(share) for name, share in self.state.shares.items()}
        self.state.load_config(config, now)
        self._plan_timers()
        for seq in self.state.live_names.values():  # a wait changed
            job = self.state.jobs[seq]
            if queued(job):
                self.lifecycle.await_patience(job, now)
        for name, share in self.state.shares.items():
            if thresholds.get(name) != _threshold_settings(share):
                self.lifecycle.threshold_changed(name, now)
        return self.lifecycle.flush()

    def set_provider_available(self, instance_type: str, available: int | None, now: float) -> None:
        """How many on-demand instances of a type the provider can give (None: unlimited)."""
        ledger = self.state.types.get(instance_type)
        if ledger is None:
            return
        self.state.meter.touch(ledger, now)
        ledger.available = available
        self.state.changes.improved.add(instance_type)

    def capacity_error(self, job: Job, now: float, backoff_seconds: float) -> list[Decision]:
        """The backend had no capacity for the placed entry: the job is RUNNABLE again and the
        entry is skipped for ``backoff_seconds``; no attempt is consumed."""
        self.lifecycle.no_capacity(job, now, backoff_seconds)
        return self.lifecycle.flush()

    def job_running(self, job: Job, now: float) -> None:
        """The backend reports training has begun (work counts from now)."""
        if job.state.holds_capacity and not job.stopping:
            self.lifecycle.start_running(job, now)

    def job_finished(self, job: Job, now: float, succeeded: bool, reason: str = "") -> list[Decision]:
        """An attempt ended by itself: success, or a failure retried per retry_attempts/retry_on."""
        if not job.state.holds_capacity or job.stopping:
            return []
        if succeeded:
            self.lifecycle.succeed(job, now)
        else:
            self.lifecycle.attempt_failed(job, reason, now)
        return self.lifecycle.flush()

    def victim_stopped(self, job: Job, now: float) -> list[Decision]:
        """A preempted job has stopped after its grace period; its preemptor may start."""
        if job.stopping:
            self.lifecycle.victim_down(job, now)
        return self.lifecycle.flush()

    def forget_finished(self) -> int:
        """Forget the finished jobs nothing in the state refers to any more; how many.

        A finished job changes no decision: it is in no queue, holds nothing, and every input
        about it is refused or changes nothing. What refers to one for a while: a victim
        cancelled during its grace (``stopping``: its stop is still awaited) and the preemptor
        such a victim stops for, the changes and the guarantee watch until the next cycle has
        looked, a timer (which finds it gone and is dropped as stale). The quota service forgets
        them before each snapshot (``core/snapshot.py``), so that its memory and its snapshots
        hold the live jobs, not the history; their rows stay in the database. An input naming
        a forgotten job's ``ref`` is answered by the caller (``by_ref`` raises KeyError)."""
        state = self.state
        held = state.changes.jobs | set(self._guarantees.violating) | set(self.lifecycle.ready())
        held |= {job.stopping_for for job in state.jobs.values() if job.stopping_for is not None}
        gone = [
            job
            for job in state.jobs.values()
            if job.state.is_final and not job.stopping and job.placement is None and job.seq not in held
        ]
        for job in gone:
            del state.jobs[job.seq]
            if job.ref is not None and state.refs.get(job.ref) == job.seq:
                del state.refs[job.ref]
            if state.latest_names.get(job.name) == job.seq:
                del state.latest_names[job.name]
        return len(gone)

    def guarantee_watched(self) -> bool:
        """Whether the guarantee watchdog follows a waiting job into the next cycle. A cycle that
        finds or leaves it so changed what the next cycle alerts on, even when it decided
        nothing: the service logs such a cycle, so a new leader counts the same cycles."""
        return bool(self._guarantees.violating)

    def _plan_timers(self) -> None:
        """A cycle at every plan window's start and end."""
        for plan in self.state.plans.values():
            self.lifecycle.timer(plan.starts_at, TYPE, plan.instance_type)
            self.lifecycle.timer(plan.ends_at, TYPE, plan.instance_type)

    # -- the cycle -----------------------------------------------------------------------

    def run_cycle(self, now: float) -> list[Decision]:
        """One scheduling cycle at ``now``:

        0. timers that fell due: plan windows, protection ends, back-offs mark their type,
           a job's wait before in-share preemption ends marks the job;
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

        With the fast index, only jobs that might fit now are looked at: those whose types got
        easier since the last cycle, and jobs that are new or changed (see ``index/fast.py``).
        """
        self.cycles += 1
        life = self.lifecycle
        life.fire_timers(now)  # 0 and 1
        life.start_ready(now)  # 0
        work = fast.begin(self.state)
        PLACERS[self.index](life, now, work)  # 2 to 5
        for seq in work.changed:
            work.improved |= self.state.jobs[seq].instance_types
        self._guarantees.check(life, now, work.improved)  # 6, where anything changed
        return life.flush()


def _threshold_settings(share: Share) -> tuple[float | None, float, float]:
    """What a share's starvation threshold is made of in its configuration."""
    return (share.starvation_after_seconds, share.starvation_multiple, share.starvation_min_seconds)
