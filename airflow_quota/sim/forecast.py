"""When will each waiting job start? ``forecast`` runs the unchanged core forward from the quota
state as it stands, with no new arrivals, several times with runtimes drawn from each job's
estimate (``core/estimates.py``), and gives every queued job its median expected start, a
10-90% range, the entry it is expected on, whether it will borrow or preempt to start; and
every job that holds capacity its expected end.

Pure, like the core: the scheduler is copied, never changed; the estimates are passed in; the
draws are seeded, so one state and one seed give one forecast. A job whose start no run reached
within the horizon gets no time, with the reason.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import random
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel

from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.estimates import EstimateSource, RuntimeEstimate
from airflow_quota.core.inputs import AttemptRunning, Input
from airflow_quota.core.lifecycle import queued
from airflow_quota.core.model import Decision, Entry, Job, JobState, Placed, Preempted
from airflow_quota.sim.gc_tuning import fewer_collections
from airflow_quota.sim.scenario import FailureSpec, LoadedScenario, ProviderState
from airflow_quota.sim.simulator import _FINISH, _STOPPED, Simulator

RUNS = 3
"""Forward runs a forecast makes by default. Each job's runtime is drawn once from each third of
its estimate over the three (``_Slices``); the calibration by the record of earlier forecasts
(``Calibration``) gives most of the range. On ITP 2, 3, 4 and 8 runs are equally accurate within
the draws' own noise (BENCHMARKS.md, "The forecast"); three cost 3/8 of eight."""
HORIZON_SECONDS = 30 * 86_400.0
"""How far ahead a forward run looks: a job not started by then gets no time."""
_FOREVER = 1e15
"""The runtime of a job with no estimate in a forward run: it holds its capacity throughout."""


@dataclass(frozen=True, slots=True)
class ExpectedStart:
    """A queued job's forecast: when it is expected to start, and how."""

    job: str
    share: str
    start: float | None
    """The median start over the runs (the core's clock), None when half the runs or more did
    not start it within the horizon."""
    low: float | None
    """The start 10% of the runs reached (the range's early end)."""
    high: float | None
    """The start 90% of the runs reached, None when more than 10% did not start it."""
    entry: Entry | None
    """The entry it started on in most runs."""
    borrowed: int
    """Instances above its share's limit in the placement the median run made."""
    preempts: bool
    """Whether it preempted to start in most runs."""
    must_borrow: int
    """Instances its expected entry asks above its share's limit: it needs that many lent at once."""
    runtime: EstimateSource
    """Where its own runtime estimate came from (its expected end; not its start)."""
    reason: str | None = None
    """Why there is no start, when there is none."""


@dataclass(frozen=True, slots=True)
class ExpectedEnd:
    """A job holding capacity: when it is expected to end (its runtime drawn, less what it ran)."""

    job: str
    end: float | None
    low: float | None
    high: float | None
    runtime: EstimateSource


@dataclass(frozen=True)
class Forecast:
    """Every queued job's expected start and every placed job's expected end, as of ``at``."""

    at: float
    runs: int
    starts: dict[str, ExpectedStart] = field(default_factory=dict)
    ends: dict[str, ExpectedEnd] = field(default_factory=dict)


def forecast(
    scheduler: QuotaScheduler,
    now: float,
    estimates: Mapping[int, RuntimeEstimate],
    runs: int = RUNS,
    seed: int = 0,
    horizon: float = HORIZON_SECONDS,
    jobs: Collection[int] | None = None,
    give_way: Callable[[], None] | None = None,
) -> Forecast:
    """Forecast the queued jobs (those of ``jobs``, by the core's sequence number, when given)
    from the scheduler's state at ``now``. ``estimates`` holds each live job's runtime estimate
    by sequence number; a job without one holds its capacity to the horizon. ``give_way`` is
    called before each input a forward run hands the core: where a worker process waits while
    the leader it serves runs its own core."""
    state = scheduler.state
    targets = sorted(seq for seq, job in state.jobs.items() if queued(job) and (jobs is None or seq in jobs))
    starts: dict[int, list[tuple[float, Placed, bool]]] = {seq: [] for seq in targets}
    ends: dict[int, list[float]] = {}
    with fewer_collections():  # the copies make many objects and no reference cycle
        copies = _Copies(scheduler)
        slices = _Slices(state.jobs, runs, seed)
        for run in range(runs):
            rng = random.Random(f"{seed}:{run}")
            copy = copies.copy()
            copy.forget_finished()  # the run plays the live jobs, not the history
            played = _Forward(copy, now, estimates, rng, now + horizon, slices.of_run(run), give_way)
            for seq, end in played.ends.items():
                ends.setdefault(seq, []).append(end)
            played.watch(targets)
            for seq, (placed, preempts) in played.placed.items():
                starts[seq].append((placed.at, placed, preempts))
    result = Forecast(now, runs)
    for seq in targets:
        job = state.jobs[seq]
        estimate = estimates.get(seq, RuntimeEstimate(EstimateSource.NONE))
        result.starts[job.name] = _expected_start(
            state_job=job, runs=runs, seen=starts[seq], scheduler=scheduler, source=estimate.source, horizon=horizon
        )
    for seq, values in ends.items():
        job = state.jobs[seq]
        source = estimates.get(seq, RuntimeEstimate(EstimateSource.NONE)).source
        known = sorted(v for v in values if v < _FOREVER / 2)
        if len(known) < len(values):
            result.ends[job.name] = ExpectedEnd(job.name, None, None, None, source)
        else:
            result.ends[job.name] = ExpectedEnd(job.name, _at(known, 0.5), _at(known, 0.1), _at(known, 0.9), source)
    return result


class Calibration:
    """What the forecasts' own record says of them: the ratio of each started job's actual wait
    to the wait forecast at its submission, the most recent ``keep``, of the pool and of each
    share. A forward run sees no arrival, so it is early when later jobs take capacity first
    (another share reclaiming what it lent, a higher priority), and by how much depends on the
    share; once ``needed`` jobs have started, a forecast's wait is scaled by the record's median
    ratio and its range by the 10% and 90% ratios: its share's record once that holds
    ``needed``, the pool's before. Only outcomes already known are used."""

    def __init__(self, keep: int = 500, needed: int = 30) -> None:
        self._ratios: deque[float] = deque(maxlen=keep)
        self._by_share: dict[str, deque[float]] = {}
        self.keep = keep
        self.needed = needed

    def learn(self, share: str, forecast_wait: float, actual_wait: float) -> None:
        """A job of ``share`` forecast to wait ``forecast_wait`` seconds started after
        ``actual_wait``. A wait below zero (a start before the forecast was made: clocks of two
        hosts) says nothing of the forecast and is not learned."""
        if forecast_wait > 0 and actual_wait >= 0:
            ratio = actual_wait / forecast_wait
            self._ratios.append(ratio)
            self._by_share.setdefault(share, deque(maxlen=self.keep)).append(ratio)

    @property
    def ready(self) -> bool:
        return len(self._ratios) >= self.needed

    def apply(self, expected: ExpectedStart, now: float) -> ExpectedStart:
        """The forecast scaled by the record, when it holds enough; as it was otherwise, or
        when it gave no start."""
        if not self.ready or expected.start is None:
            return expected
        own = self._by_share.get(expected.share)
        ratios = sorted(own if own is not None and len(own) >= self.needed else self._ratios)
        wait = expected.start - now
        low, middle, high = (_at(ratios, q) for q in (0.1, 0.5, 0.9))
        return dataclasses.replace(
            expected,
            start=now + wait * middle,
            low=now + min(wait * low, (expected.low or expected.start) - now),
            high=None if expected.high is None else now + max(wait * high, expected.high - now),
        )


def _expected_start(
    state_job: Job,
    runs: int,
    seen: list[tuple[float, Placed, bool]],
    scheduler: QuotaScheduler,
    source: EstimateSource,
    horizon: float,
) -> ExpectedStart:
    """Summarise one job's starts over the runs: a run that did not start it counts as later
    than any that did."""
    times = sorted(at for at, _, _ in seen) + [float("inf")] * (runs - len(seen))
    median = _at(times, 0.5)
    if median == float("inf"):
        reason = f"not started within {horizon / 86_400:g} days in {runs - len(seen)} of {runs} forward runs"
        return ExpectedStart(state_job.name, state_job.share, None, None, None, None, 0, False, 0, source, reason)
    low, high = _at(times, 0.1), _at(times, 0.9)
    middle = min(seen, key=lambda item: abs(item[0] - median))[1]
    entries: dict[Entry, int] = {}
    for _, placed, _ in seen:
        entries[placed.entry] = entries.get(placed.entry, 0) + 1
    entry = max(entries, key=lambda e: (entries[e], -state_job.entries.index(e) if e in state_job.entries else 0))
    preempts = sum(1 for _, _, p in seen if p) * 2 > len(seen)
    limit = scheduler.state.types[entry.instance_type].limit_of(state_job.share)
    return ExpectedStart(
        state_job.name,
        state_job.share,
        median,
        low,
        None if high == float("inf") else high,
        entry,
        middle.borrowed,
        preempts,
        max(0, entry.count - limit),
        source,
    )


def _at(values: list[float], q: float) -> float:
    """The value below which a share ``q`` of the sorted values lies (nearest rank)."""
    return values[min(len(values) - 1, int(q * len(values)))]


class _Copies:
    """Copies of a scheduler to run forward. What the core never changes is shared, not copied:
    the validated values (requests, the configuration: pydantic models), the entries (frozen)
    and a job's tuple of them."""

    def __init__(self, scheduler: QuotaScheduler) -> None:
        self._shared: list[object] = []
        self._ids: dict[int, int] = {}
        self._kinds: dict[type, bool] = {}
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = self._share  # type: ignore[method-assign]
        pickler.dump(scheduler)
        self._frozen = buffer.getvalue()

    def _share(self, value: object) -> int | None:
        kind = type(value)
        never_changed = self._kinds.get(kind)
        if never_changed is None:
            never_changed = self._kinds[kind] = issubclass(kind, (Entry, BaseModel))
        if not never_changed and not (type(value) is tuple and value and all(type(item) is Entry for item in value)):
            return None
        index = self._ids.get(id(value))
        if index is None:
            index = self._ids[id(value)] = len(self._shared)
            self._shared.append(value)  # kept alive, so that its id stays its own
        return index

    def copy(self) -> QuotaScheduler:
        unpickler = pickle.Unpickler(io.BytesIO(self._frozen))
        unpickler.persistent_load = self._shared.__getitem__  # type: ignore[method-assign]
        copied: QuotaScheduler = unpickler.load()
        return copied


class _Forward(Simulator):
    """One forward run: the simulator taking over a copy of the core at ``now``, no arrivals,
    every live job's runtime drawn once from its estimate (from its slice of it, with ``slices``),
    ``give_way`` called before each input it hands the core."""

    def __init__(
        self,
        scheduler: QuotaScheduler,
        now: float,
        estimates: Mapping[int, RuntimeEstimate],
        rng: random.Random,
        until: float,
        slices: Mapping[int, tuple[float, float]] | None = None,
        give_way: Callable[[], None] | None = None,
    ) -> None:
        config = scheduler.state.config
        empty = LoadedScenario.model_construct(
            start=scheduler.state.origin, config=config, provider=ProviderState(), events=[]
        )
        super().__init__(empty, until=until, scheduler=scheduler)
        self.give_way = give_way
        self.now = now
        self.ends: dict[int, float] = {}
        """Each placed job's drawn end."""
        self.placed: dict[int, tuple[Placed, bool]] = {}
        for seq in sorted(scheduler.state.jobs):
            job = scheduler.state.jobs[seq]
            if job.state.is_final or job.state is JobState.SUBMITTED:
                continue
            estimate = estimates.get(seq)
            if estimate is None:
                drawn = None
            else:
                drawn = estimate.draw(rng, *slices[seq]) if slices is not None else estimate.draw(rng)
            total = _FOREVER if drawn is None else drawn
            self._sim_jobs[seq] = _Drawn(total)
            self._take_over(job, total, now)

    def _take_over(self, job: Job, total: float, now: float) -> None:
        """Carry on what the job is doing at ``now``: a victim stops at once, a placed job runs
        (started now if it had not yet) to the end of its drawn runtime."""
        if job.placement is None or not job.state.holds_capacity:
            return
        assert job.ref is not None
        if job.stopping:
            self._at(now, _STOPPED, job, job.attempts)
            return
        if job.state is not JobState.RUNNING:
            self._handle(AttemptRunning(job.ref, job.attempts, now), now)
        ran = job.progress + (now - job.running_since if job.running_since is not None else 0.0)
        remaining = max(0.0, total - ran)
        self.ends[job.seq] = now + remaining
        self._at(now + remaining, _FINISH, job, job.attempts)

    def _handle(self, item: Input, now: float) -> list[Decision]:
        if self.give_way is not None:
            self.give_way()
        return super()._handle(item, now)

    def _keep(self, decision: Decision) -> None:
        """A decision goes to ``watch`` only: no report reads a forward run's, so none is kept."""
        if self.on_decision is not None:
            self.on_decision(decision)

    def watch(self, targets: list[int]) -> None:
        """Run until every target job has started (or the horizon), noting how each started."""
        waiting = set(targets)
        jobs = self.scheduler.state.jobs
        preemptors: set[str] = set()

        def seen(decision: Decision) -> None:
            if isinstance(decision, Preempted):
                preemptors.add(decision.by)
            elif isinstance(decision, Placed):
                job = self.scheduler.job(decision.job)
                if job.seq in waiting:
                    waiting.discard(job.seq)
                    self.placed[job.seq] = (decision, decision.job in preemptors)

        self.on_decision = seen
        if waiting:
            self.run(start=self.now, stop=lambda: not waiting or all(jobs[s].state.is_final for s in waiting))
        self.on_decision = None


@dataclass(frozen=True, slots=True)
class _Drawn:
    """What a forward run plays for a job: its drawn runtime, no start-up, no failure."""

    duration: float
    startup_seconds: float = 0.0
    failures: tuple[FailureSpec, ...] = ()


class _Slices:
    """Stratified draws: over ``runs`` forward runs, each job's runtime is drawn once from each
    of ``runs`` equal slices of its estimate (by rank), in an order of the job's own. Plain
    draws leave a job's few runs clustered by chance; one draw a slice spreads them over its
    estimate, so fewer runs give as good a median and range."""

    def __init__(self, jobs: Collection[int], runs: int, seed: int) -> None:
        rng = random.Random(f"{seed}:slices")
        order = list(range(runs))
        self._orders: dict[int, tuple[int, ...]] = {}
        for seq in jobs:
            rng.shuffle(order)
            self._orders[seq] = tuple(order)
        self.runs = runs

    def of_run(self, run: int) -> dict[int, tuple[float, float]]:
        """Each job's slice in run ``run``: (from, to) as fractions of its estimate's runs."""
        width = 1 / self.runs
        return {seq: (order[run] * width, (order[run] + 1) * width) for seq, order in self._orders.items()}
