"""The discrete-event simulator of docs/simulate.md: a SimPy-style heap of timed happenings driving
the same ``QuotaScheduler`` the service runs, on a simulated clock.

At each time t when something happens: first jobs that finish or fail at t release their
capacity, then the scenario's events at t apply in file order, then exactly one scheduling cycle
runs. A time when nothing happens (only a stale finish of a preempted attempt, a timer made
moot) gets no cycle.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.index import IndexName
from airflow_quota.core.inputs import (
    AttemptFailed,
    AttemptRunning,
    AttemptStopped,
    AttemptSucceeded,
    ConfigurationApplied,
    CycleDue,
    Input,
    JobCancelled,
    JobSubmitted,
    PrioritySet,
    ProviderAvailability,
    handle,
)
from airflow_quota.core.model import Decision, Job, Placed, Preempted, Rejected
from airflow_quota.sim.gc_tuning import fewer_collections
from airflow_quota.sim.scenario import (
    Event,
    FailureSpec,
    LoadedScenario,
    apply_pool_update,
    apply_share_update,
)


class Played(Protocol):
    """What the simulated backend plays for a job (a scenario's ``SimJob``, or a forecast's draw)."""

    @property
    def duration(self) -> float: ...
    @property
    def startup_seconds(self) -> float: ...
    @property
    def failures(self) -> Sequence[FailureSpec]: ...


# what the simulated backend does at a time, in this order within one instant
_RUNNING, _FINISH, _FAIL, _STOPPED = 0, 1, 2, 3


@dataclass
class SimulationResult:
    scheduler: QuotaScheduler
    decisions: list[Decision]
    end: float
    cycles: int = 0


class Simulator:
    """Replays one scenario; ``run`` returns every decision in the order it happened."""

    def __init__(
        self,
        scenario: LoadedScenario,
        until: float | None = None,
        progress: Callable[[float, int, int], None] | None = None,
        index: IndexName = "fast",
        scheduler: QuotaScheduler | None = None,
    ) -> None:
        self.scenario = scenario
        self.until = until
        self.scheduler = scheduler or QuotaScheduler(scenario.config, origin=scenario.start)
        """The core it drives: a new one, or one taken over as it stands (``sim/forecast.py``)."""
        self.scheduler.index = index
        self.config: QuotaConfig = scenario.config
        self.decisions: list[Decision] = []
        self._happenings: list[tuple[float, int, int, int, int]] = []
        self._order = 0
        self._sim_jobs: dict[int, Played] = {}
        self._rejected: dict[str, str] = {}
        self._progress = progress
        self._cycle_watchers: list[Callable[[QuotaScheduler, float], None]] = []
        self.on_decision: Callable[[Decision], None] | None = None
        """Called with every decision as it is made (the CLI's --log)."""
        self._refs: dict[str, int] = {}
        """The reference in the core of the latest accepted job of each name."""
        self._submissions = 0
        """Submissions so far: the next one's reference is this plus one."""
        for name, count in scenario.provider.available.items():
            self._handle(ProviderAvailability(name, count), 0.0)

    @fewer_collections()
    def run(self, start: float = 0.0, stop: Callable[[], bool] | None = None) -> SimulationResult:
        """Play the scenario from ``start``; with ``stop``, end after the first cycle it is true."""
        events = self.scenario.events
        next_event = 0
        now = start
        scheduler = self.scheduler
        while True:
            self._drop_stale()
            candidates = []
            if next_event < len(events):
                candidates.append(events[next_event].at)
            if self._happenings:
                candidates.append(self._happenings[0][0])
            live = self._live_jobs()
            timer = scheduler.next_timer()
            if timer is not None and (live or next_event < len(events)):
                candidates.append(max(timer, now))
            if not candidates:
                break
            now = min(candidates)
            if self.until is not None and now > self.until:
                now = self.until
                break
            self._play_backend(now)
            while next_event < len(events) and events[next_event].at == now:
                self._apply(events[next_event], now)
                next_event += 1
            self._act(self._handle(CycleDue(), now), now)
            if self._progress is not None:
                state = scheduler.state
                self._progress(now, scheduler.cycles, len(state.jobs) - len(state.live_names))
            for watcher in self._cycle_watchers:
                watcher(scheduler, now)
            if stop is not None and stop():
                break
            if not self._live_jobs() and next_event >= len(events) and not self._happenings:
                break
        return SimulationResult(scheduler, self.decisions, now, scheduler.cycles)

    def after_each_cycle(self, watcher: Callable[[QuotaScheduler, float], None]) -> None:
        """Call ``watcher(scheduler, now)`` after every cycle of the run, in the order added: how
        tests check invariants and benchmarks sample the live state mid-run, without touching the
        simulator's internals."""
        self._cycle_watchers.append(watcher)

    def played(self, job: Job) -> Played:
        """What the simulated backend plays for the job: its duration, start-up and failures."""
        return self._sim_jobs[job.seq]

    def _live_jobs(self) -> bool:
        return len(self.scheduler.state.live_names) > 0

    def _at(self, at: float, what: int, job: Job, attempt: int) -> None:
        self._order += 1
        heapq.heappush(self._happenings, (at, what, self._order, job.seq, attempt))

    def _stale(self, what: int, seq: int, attempt: int) -> bool:
        """A happening of an attempt that was preempted or cancelled, or of a job the core has
        forgotten (finished, ``QuotaScheduler.forget_finished``): nothing happens then."""
        job = self.scheduler.state.jobs.get(seq)
        if job is None:
            return True
        return what != _STOPPED and (job.attempts != attempt or not job.state.holds_capacity or job.stopping)

    def _drop_stale(self) -> None:
        """Forget stale happenings at the head of the heap, so that no cycle runs at a time
        when nothing happens (docs/model.md rule 4.0.4: a finish the attempt would have had is not
        something that happens)."""
        while self._happenings:
            _, what, _, seq, attempt = self._happenings[0]
            if not self._stale(what, seq, attempt):
                break
            heapq.heappop(self._happenings)

    def _play_backend(self, now: float) -> None:
        """What the simulated training does at ``now``: starts, finishes, failures, stops."""
        scheduler = self.scheduler
        while self._happenings and self._happenings[0][0] <= now:
            _, what, _, seq, attempt = heapq.heappop(self._happenings)
            if self._stale(what, seq, attempt):
                continue
            job = scheduler.state.jobs[seq]
            assert job.ref is not None
            if what == _STOPPED:
                self._record(self._handle(AttemptStopped(job.ref, attempt), now))
                continue
            if what == _RUNNING:
                self._handle(AttemptRunning(job.ref, attempt, now), now)
                self._schedule_end(job, now)
            elif what == _FINISH:
                self._record(self._handle(AttemptSucceeded(job.ref, attempt), now))
            else:
                reason = self._sim_jobs[seq].failures[attempt - 1].reason
                self._record(self._handle(AttemptFailed(job.ref, attempt, reason), now))

    def _schedule_end(self, job: Job, now: float) -> None:
        sim = self._sim_jobs[job.seq]
        remaining = max(0.0, sim.duration - job.progress)
        attempt = job.attempts
        if attempt <= len(sim.failures) and sim.failures[attempt - 1].after < remaining:
            self._at(now + sim.failures[attempt - 1].after, _FAIL, job, attempt)
        else:
            self._at(now + remaining, _FINISH, job, attempt)

    def _handle(self, item: Input, now: float) -> list[Decision]:
        return handle(self.scheduler, item, now)

    def _apply(self, event: Event, now: float) -> None:
        if event.submit is not None:
            sim = event.submit
            self._submissions += 1
            ref = self._submissions
            decisions = self._handle(JobSubmitted(ref, sim), now)
            if decisions and isinstance(decisions[0], Rejected):
                self._rejected[sim.name] = sim.share
            else:
                self._refs[sim.name] = ref
                self._sim_jobs[self.scheduler.by_ref(ref).seq] = sim
            self._record(decisions)
        elif event.set_priority is not None:
            if not self._refuse_unknown(event.set_priority.job, "set_priority", now):
                ref = self._refs[event.set_priority.job]
                self._record(self._handle(PrioritySet(ref, event.set_priority.priority), now))
        elif event.cancel is not None:
            if not self._refuse_unknown(event.cancel.job, "cancel", now):
                self._record(self._handle(JobCancelled(self._refs[event.cancel.job]), now))
        elif event.update_share is not None:
            self._reconfigure(QuotaConfig.model_validate(apply_share_update(self.config, event.update_share)), now)
        elif event.update_pool is not None:
            self._reconfigure(QuotaConfig.model_validate(apply_pool_update(self.config, event.update_pool)), now)
        elif event.provider is not None:
            for name, count in event.provider.available.items():
                self._handle(ProviderAvailability(name, count), now)

    def _refuse_unknown(self, name: str, request: str, now: float) -> bool:
        """An event for a job whose submission was rejected: there is no job to change."""
        if name in self._refs:
            return False
        error = f"job: {name!r} does not exist (its submission was rejected)"
        self._keep(Rejected(now, name, self._rejected.get(name, ""), error, request=request))
        return True

    def _reconfigure(self, config: QuotaConfig, now: float) -> None:
        self.config = config
        self._record(self._handle(ConfigurationApplied(config), now))

    def _record(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            self._keep(decision)

    def _keep(self, decision: Decision) -> None:
        self.decisions.append(decision)
        if self.on_decision is not None:
            self.on_decision(decision)

    def _act(self, decisions: list[Decision], now: float) -> None:
        """Carry a cycle's decisions out on the simulated backend."""
        scheduler = self.scheduler
        for decision in decisions:
            self._keep(decision)
            if isinstance(decision, Placed):
                job = scheduler.job(decision.job)
                if decision.attempt != job.attempts:
                    continue  # placed, preempted and placed again in this one cycle: only the last starts
                sim = self._sim_jobs[job.seq]
                if sim.startup_seconds > 0:
                    self._at(now + sim.startup_seconds, _RUNNING, job, job.attempts)
                else:
                    assert job.ref is not None
                    self._handle(AttemptRunning(job.ref, job.attempts, now), now)
                    self._schedule_end(job, now)
            elif isinstance(decision, Preempted) and decision.grace_seconds > 0:
                job = scheduler.job(decision.job)
                self._at(now + decision.grace_seconds, _STOPPED, job, job.attempts)
