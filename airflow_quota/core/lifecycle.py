"""How jobs move between states when the core decides (docs/model.md sections 3, 6, 8): queued,
placed, preempted, stopped, requeued, failed, starving. Keeps the state's indexes, the timers
and the outbox of decisions in step; the cycle and the scheduler's API call into it.

``Lifecycle`` is the only writer of a job's state, and every change of it is one of
``TRANSITIONS`` (``Lifecycle.move``): a change outside the table is a bug, raised at once.
"""

from __future__ import annotations

import heapq
from fnmatch import fnmatchcase
from typing import Any

from airflow_quota.core.model import (
    Alert,
    AlertKind,
    Decision,
    Entry,
    Failed,
    FailureReason,
    Job,
    JobState,
    Placed,
    Placement,
    Preempted,
    PreemptionKind,
    PreemptionRecord,
    Requeued,
    Succeeded,
)
from airflow_quota.core.normal_wait import Threshold, starvation_threshold
from airflow_quota.core.state import QuotaState

# timer kinds
DEADLINE, STARVE, TYPE, PATIENCE = 0, 1, 2, 3

_RUNNABLE, _FAILED = JobState.RUNNABLE, JobState.FAILED
_HELD_ENDS = frozenset({JobState.RUNNING, JobState.RUNNABLE, JobState.SUCCEEDED, JobState.FAILED})
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.SUBMITTED: frozenset({_RUNNABLE}),
    JobState.RUNNABLE: frozenset({JobState.SCHEDULED, _FAILED}),
    JobState.SCHEDULED: _HELD_ENDS,
    JobState.STARTING: _HELD_ENDS,
    JobState.RUNNING: _HELD_ENDS - {JobState.RUNNING},
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
}
"""The states a job may move to from each (docs/model.md rule 3.1):

- SUBMITTED → RUNNABLE: accepted into its share's queue at once;
- RUNNABLE → SCHEDULED: placed (or its victims have stopped); → FAILED: expired, cancelled, a
  CPU-only list without capacity;
- SCHEDULED or STARTING → RUNNING: the training began;
- SCHEDULED, STARTING or RUNNING → RUNNABLE: preempted and stopped, a failed attempt retried,
  a capacity error; → SUCCEEDED; → FAILED: attempts or preemptions used up, cancelled.

STARTING is the backends' (the store's): the core moves a job from SCHEDULED to RUNNING."""


class IllegalTransition(AssertionError):
    """A job was asked to move between states ``TRANSITIONS`` does not connect: a bug."""


def queued(job: Job) -> bool:
    """Waiting in its share's queue: RUNNABLE, not placed, not a victim still stopping."""
    return job.state is JobState.RUNNABLE and job.placement is None and not job.stopping


class Lifecycle:
    """Job state changes on the quota state, with the timers they need and the decisions they make."""

    def __init__(self, state: QuotaState) -> None:
        self.state = state
        self._timers: list[tuple[float, int, int, Any]] = []
        self._timer_seq = 0
        self._starve_due: dict[str, float] = {}
        """Share → when its next job passes its starvation threshold: its one live STARVE timer."""
        self._ready: list[int] = []
        """Preemptors whose victims have all stopped: placed at the next cycle."""
        self._out: list[Decision] = []

    # -- timers --------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        """When the core next needs a cycle (a deadline, a threshold, a window), if ever.
        Timers made moot since (the job was placed, requeued or finished) are dropped."""
        while self._timers:
            at, _, kind, payload = self._timers[0]
            if not self._stale(at, kind, payload):
                break
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _stale(self, at: float, kind: int, payload: Any) -> bool:
        if kind == TYPE:
            return False
        if kind == STARVE:
            return self._starve_due.get(payload) != at
        seq, since = payload
        job = self.state.jobs.get(seq)  # None: finished and forgotten (``QuotaScheduler.forget_finished``)
        if job is None or not queued(job) or job.runnable_since != since:
            return True
        if kind == DEADLINE:
            return job.pending_deadline != at
        return False

    def timer(self, at: float, kind: int, payload: Any) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (at, self._timer_seq, kind, payload))

    def fire_timers(self, now: float) -> None:
        state = self.state
        while self._timers and self._timers[0][0] <= now:
            at, _, kind, payload = heapq.heappop(self._timers)
            if kind == TYPE:
                state.changes.improved.add(payload)
                continue
            if self._stale(at, kind, payload):
                continue
            if kind == STARVE:
                self.judge_waits(payload, now)
                continue
            job = state.jobs[payload[0]]
            if kind == DEADLINE:
                state.dequeue(job)
                self.fail(
                    job,
                    FailureReason.PENDING_TIMEOUT,
                    f"RUNNABLE for {job.request.max_pending_seconds:g} s (max_pending_seconds)",
                    now,
                )
            elif kind == PATIENCE:
                ends = patience_ends(state, job)
                if ends is not None and ends > now:
                    self.timer(ends, PATIENCE, payload)  # the wait was lengthened meanwhile
                else:
                    state.changes.jobs.add(job.seq)  # it may preempt in its share from now on

    def await_patience(self, job: Job, now: float) -> None:
        """A cycle when the queued job may start to preempt in its share, if that is still to come."""
        ends = patience_ends(self.state, job)
        if ends is not None and ends > now:
            self.timer(ends, PATIENCE, (job.seq, job.runnable_since))

    def threshold(self, share: str) -> Threshold:
        """The share's starvation threshold now (docs/model.md rule 8.2)."""
        return starvation_threshold(self.state.shares[share], self.state.recent_waits[share])

    def await_starvation(self, share: str, now: float) -> None:
        """A cycle when the share's earliest job not yet past its threshold will be, at the
        threshold as it is now; one timer a share, moved whenever the threshold or that job
        changes (a job becomes RUNNABLE, the share places one, the configuration changes)."""
        unjudged = self.state.queues[share].unjudged
        if not unjudged:
            self._starve_due.pop(share, None)
            return
        due = max(now, unjudged[0][0] + self.threshold(share).seconds)
        if self._starve_due.get(share) != due:
            self._starve_due[share] = due
            self.timer(due, STARVE, share)

    def judge_waits(self, share: str, now: float) -> None:
        """The share's jobs now past its threshold (rule 8.2): those already overtaken start
        starving, the others are watched (queueing, not starving, until someone overtakes them)."""
        state = self.state
        unjudged = state.queues[share].unjudged
        threshold = self.threshold(share).seconds
        while unjudged and unjudged[0][0] + threshold <= now:
            _, seq = unjudged.pop(0)
            job = state.jobs[seq]
            job.past_threshold = True
            if state.overtakes.overtaken(job) > 0:
                self.start_starving(job, now)
            else:
                state.overtakes.watch(job)
        self._starve_due.pop(share, None)
        self.await_starvation(share, now)

    def threshold_changed(self, share: str, now: float) -> None:
        """The share's threshold settings changed (docs/model.md rule 5.2): a job past the old
        threshold but not the new one is no longer watched for overtaking; one past the new
        threshold is judged at the next cycle. A job starving already stays so."""
        state = self.state
        queue = state.queues[share]
        threshold = self.threshold(share).seconds
        for key in queue.runnable:
            job = state.jobs[key[2]]
            if job.past_threshold and not job.starving and job.runnable_since + threshold > now:
                state.overtakes.unwatch(job)
                job.past_threshold = False
                queue.unjudged.add((job.runnable_since, job.seq))
        self._starve_due.pop(share, None)
        self.await_starvation(share, now)

    def ready(self) -> tuple[int, ...]:
        """The preemptors whose victims have all stopped, placed at the next cycle."""
        return tuple(self._ready)

    def start_ready(self, now: float) -> None:
        """Step 0 of the cycle: preemptors whose victims have all stopped are placed."""
        state = self.state
        for seq in self._ready:
            held = state.jobs[seq]
            if held.placement is not None and held.state is JobState.RUNNABLE:
                self.start_held(held, now)
        self._ready = []

    # -- state changes -------------------------------------------------------------------

    @staticmethod
    def move(job: Job, to: JobState) -> None:
        """The one place a job's state changes, along ``TRANSITIONS``."""
        if to not in TRANSITIONS[job.state]:
            raise IllegalTransition(f"job {job.name!r} cannot move from {job.state.value} to {to.value}")
        job.state = to

    def make_runnable(self, job: Job, now: float, keep_pending_clock: bool = False) -> None:
        state = self.state
        self.move(job, JobState.RUNNABLE)
        job.placement = None
        job.stopping = False
        job.starving = False
        job.past_threshold = False
        job.running_since = None
        job.runnable_since = now
        max_pending = job.request.max_pending_seconds
        if max_pending is not None and not (keep_pending_clock and job.pending_deadline is not None):
            start = now
            if all(e.training_plan for e in job.entries):
                start = max(now, min(state.plans[e.training_plan].starts_at for e in job.entries if e.training_plan))
            job.pending_deadline = start + max_pending
        if job.pending_deadline is not None:
            self.timer(job.pending_deadline, DEADLINE, (job.seq, now))
        self.await_patience(job, now)
        state.enqueue(job)
        state.overtakes.became_runnable(job)
        self.await_starvation(job.share, now)
        state.changes.jobs.add(job.seq)

    def place(self, job: Job, entry: Entry, borrowed: int, now: float, why: str) -> None:
        state = self.state
        state.dequeue(job)
        job.starving = False
        state.take(job, entry, now)
        job.placement = Placement(entry, borrowed, now)
        self.start_held(job, now, why)

    def start_held(self, job: Job, now: float, why: str = "its victims have stopped") -> None:
        """The job's capacity is its own now: SCHEDULED, a new attempt."""
        state = self.state
        placement = job.placement
        assert placement is not None
        ledger = state.types[placement.entry.instance_type]
        if placement.draining:
            ledger.draining -= placement.draining
            state.changes.improved.add(ledger.name)
            placement.draining = 0
        placement.placed_at = now
        self.move(job, JobState.SCHEDULED)
        job.attempts += 1
        job.wait_seconds += now - job.runnable_since
        state.recent_waits[job.share].add(now - job.runnable_since)
        self.await_starvation(job.share, now)
        job.pending_deadline = None
        job.last_placement = placement.entry
        job.last_borrowed = placement.borrowed
        state.queues[job.share].add_running(job, ledger.name)
        state.changes.placed.add(ledger.name)
        protection = state.shares[job.share].preemption_protection_seconds
        if protection > 0:
            self.timer(now + protection, TYPE, ledger.name)
        borrowing = f", borrowing {placement.borrowed}" if placement.borrowed else ""
        self.emit(Placed(now, job.name, job.share, placement.entry, placement.borrowed, job.attempts, why + borrowing))
        self.overtake(job, placement.entry, placement.borrowed, now)

    def preempt(self, job: Job, entry: Entry, victims: list[tuple[Job, PreemptionKind]], now: float) -> None:
        state = self.state
        stopping = 0
        waiting: set[int] = set()
        for victim, kind in victims:
            grace = state.shares[victim.share].preemption_grace_seconds
            checkpoints = victim.request.checkpoint_interval is not None
            lost = 0.0 if grace > 0 and checkpoints else victim.unsaved_work(now + grace)
            assert victim.placement is not None
            count = victim.placement.entry.count
            victim.lost_gpu_seconds += lost * count * state.types[victim.placement.entry.instance_type].gpus
            self.release(victim, now)
            victim.stopping = True
            victim.stop_lost = lost
            victim.preemptions.append(PreemptionRecord(now, kind, job.name, lost))
            what = "reclaims lent capacity on " + entry.instance_type
            if kind is PreemptionKind.IN_SHARE:
                waited = now - job.runnable_since
                what = f"has higher priority on {entry.instance_type} and has waited {waited:g} s"
            self.emit(
                Preempted(
                    now,
                    victim.name,
                    victim.share,
                    kind,
                    job.name,
                    lost,
                    grace,
                    f"{job.name} ({job.share}, priority {job.priority}) {what}",
                )
            )
            if len(victim.preemptions) == state.shares[victim.share].preempted_alert_after:
                self.alert(victim, AlertKind.PREEMPTED_REPEATEDLY, f"preempted {len(victim.preemptions)} times", now)
            if grace > 0:
                waiting.add(victim.seq)
                victim.stopping_for = job.seq
                stopping += count
        ledger = state.types[entry.instance_type]
        borrowed = state.borrowed_by(job.share, entry)
        for victim, _ in victims:
            if victim.seq not in waiting:
                self.victim_down(victim, now)
        why = "after preempting " + ", ".join(v.name for v, _ in victims) if victims else "freed capacity"
        if not waiting:
            self.place(job, entry, borrowed, now, why)
            return
        state.dequeue(job)
        job.starving = False
        state.take(job, entry, now)
        job.placement = Placement(entry, borrowed, now, waiting)
        job.placement.draining = max(0, stopping - entry.count)
        ledger.draining += job.placement.draining

    def victim_down(self, victim: Job, now: float) -> None:
        """A preempted job has stopped: it is RUNNABLE again with its checkpoint, or FAILED."""
        state = self.state
        lost = victim.stop_lost
        done = now - victim.running_since if victim.running_since is not None else 0.0
        victim.progress = saved_progress(victim, done, lost)
        preemptor_seq = victim.stopping_for
        victim.stopping = False
        victim.stopping_for = None
        retries = victim.request.preemption_retries
        if victim.state.is_final:
            pass  # cancelled while it stopped (rule 5.5): it stays FAILED; its preemptor still waited
        elif retries is not None and len(victim.preemptions) > retries:
            self.fail(victim, FailureReason.PREEMPTION_LIMIT, f"preempted {len(victim.preemptions)} times", now)
        else:
            self.make_runnable(victim, now)
        if preemptor_seq is not None:
            preemptor = state.jobs[preemptor_seq]
            if preemptor.placement is not None and victim.seq in preemptor.placement.waiting_for:
                preemptor.placement.waiting_for.discard(victim.seq)
                if not preemptor.placement.waiting_for:
                    self._ready.append(preemptor.seq)

    def release(self, job: Job, now: float) -> None:
        self.state.give_back(job, now)

    def start_running(self, job: Job, now: float) -> None:
        """The backend reports training has begun: work counts from now."""
        self.move(job, JobState.RUNNING)
        job.running_since = now

    def succeed(self, job: Job, now: float) -> None:
        """The attempt ended by itself and succeeded; what it held is free."""
        done = now - job.running_since if job.running_since is not None else 0.0
        self.release(job, now)
        self.move(job, JobState.SUCCEEDED)
        job.progress += done
        self.state.final_jobs_forget(job)
        self.emit(Succeeded(now, job.name, job.share))

    def attempt_failed(self, job: Job, reason: str, now: float) -> None:
        """The attempt ended by itself and failed: the job is requeued with its checkpoint, or
        fails when its ``retry_on`` patterns do not match or its attempts are used up (rule 6.4)."""
        done = now - job.running_since if job.running_since is not None else 0.0
        self.release(job, now)
        job.failed_attempts += 1
        job.progress = saved_progress(job, done, lost=job.unsaved_work(now))
        job.running_since = None
        patterns = job.request.retry_on
        if patterns is not None and not any(fnmatchcase(reason, p) for p in patterns):
            self.fail(job, FailureReason.ATTEMPTS_EXHAUSTED, f"{reason} matches no retry_on pattern", now)
        elif job.failed_attempts >= job.request.retry_attempts:
            attempt = f"attempt {job.failed_attempts} of {job.request.retry_attempts} failed"
            self.fail(job, FailureReason.ATTEMPTS_EXHAUSTED, f"{reason}: {attempt}", now)
        else:
            self.emit(Requeued(now, job.name, job.share, reason))
            self.make_runnable(job, now)

    def no_capacity(self, job: Job, now: float, backoff_seconds: float) -> None:
        """The backend had no capacity for the placed entry: RUNNABLE again, its pending clock
        kept, the attempt it was given not counted, and the entry's source skipped by every job
        for ``backoff_seconds`` (rule 6.5)."""
        assert job.placement is not None
        entry = job.placement.entry
        self.release(job, now)
        job.attempts -= 1
        self.state.backoff_until[(entry.instance_type, entry.training_plan)] = now + backoff_seconds
        self.timer(now + backoff_seconds, TYPE, entry.instance_type)
        self.make_runnable(job, now, keep_pending_clock=True)

    def fail(self, job: Job, reason: FailureReason, detail: str, now: float) -> None:
        if job.state is JobState.RUNNABLE and not job.stopping:
            job.wait_seconds += now - job.runnable_since
        self.move(job, JobState.FAILED)
        job.failure = reason
        job.failure_detail = detail
        job.starving = False
        self.state.final_jobs_forget(job)
        self.emit(Failed(now, job.name, job.share, reason, detail))

    def overtake(self, job: Job, entry: Entry, borrowed: int, now: float) -> None:
        """``job`` was just given ``entry``: the watched jobs it overtakes start starving now,
        in the middle of the cycle, so their reservations apply to the rest of it."""
        state = self.state
        for seq in state.overtakes.placed(job, entry.instance_type, borrowed > 0):
            other = state.jobs[seq]
            if queued(other) and not other.starving:
                self.start_starving(other, now, job)

    def start_starving(self, job: Job, now: float, overtaker: Job | None = None) -> None:
        """Past its threshold and overtaken (docs/model.md rules 8.2 to 8.4): the alert, and a reservation
        when it is the first starving job of its share. A job ahead of the share's holder takes
        the reservation over at once, in the middle of the cycle too: the types the former holder
        reserved got easier for the jobs behind it (``ShareQueue.add_starving``). The alert names
        ``overtaker``, the placement that made it starve, or else the latest-submitted job that
        overtook it."""
        state = self.state
        queue = state.queues[job.share]
        job.starving = True
        state.changes.improved |= queue.add_starving(job)
        age = now - job.runnable_since
        if AlertKind.STARVING not in job.alerts:
            overtaken = state.overtakes.overtaken(job)
            latest = f"{overtaker.name} ({overtaker.share})" if overtaker else state.overtakes.latest_overtaker(job)
            by = f", latest {latest}" if latest else ""
            reason = (
                f"RUNNABLE for {age:g} s, {self.threshold(job.share).past(age)}; "
                f"overtaken by {overtaken} later placement{'s' * (overtaken != 1)}{by}"
            )
            self.alert(job, AlertKind.STARVING, reason, now, age, overtaken)

    def alert(
        self,
        job: Job,
        kind: AlertKind,
        reason: str,
        now: float,
        age: float | None = None,
        overtaken: int | None = None,
    ) -> None:
        """Raise an alert (once per job and kind) with the job's position in its share."""
        job.alerts.add(kind)
        queue = self.state.queues[job.share]
        position = queue.position(job.key) if queued(job) else None
        self.emit(Alert(now, job.name, job.share, kind, reason, position, age, overtaken))

    def emit(self, decision: Decision) -> None:
        self._out.append(decision)

    def flush(self) -> list[Decision]:
        out, self._out = self._out, []
        return out


def patience_ends(state: QuotaState, job: Job) -> float | None:
    """When the job, RUNNABLE since ``job.runnable_since``, may preempt lower-priority jobs of
    its own share (``in_share_preemption_after_seconds``); None without in-share preemption."""
    share = state.shares[job.share]
    if not share.in_share_preemption:
        return None
    return job.runnable_since + share.in_share_preemption_after_seconds


def saved_progress(job: Job, done: float, lost: float) -> float:
    """Work kept after an attempt ends: everything up to the last checkpoint."""
    if job.request.checkpoint_interval is None:
        return 0.0
    return job.progress + done - lost
