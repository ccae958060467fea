"""The ITP trace through real ``airflow-quota scheduler`` processes under chaos (issue 39): the
machinery of ``benchmarks/trace_chaos.py`` (the whole trace) and ``test_trace_replay.py`` (its
first 2,000 jobs in ``make test``).

What a run does: a PostgreSQL server of its own (``tests.postgres.Server``, so it can be
restarted), a leader and a standby with the fake backend, the trace's jobs submitted at their
trace times, and seeded faults while they run: the leader SIGKILLed (a replacement is started
at once and waits as the next standby), the server stopped and started again, and every fake
backend call (start, stop, poll) failing with the probability ``fault_rate``. At the end,
everything ``chaos.check_books`` audits (every job ended exactly once, none lost or started
twice, no capacity left in use), and the invariant of ``docs/model.md`` section 4 after every
committed step, replayed from the decision log (``audit_log``), not only sampled.

The clock. The leaders are real processes, killed with SIGKILL, so time cannot be a
``ManualClock`` stepped in one process's memory, and the trace's two months cannot pass in wall
time. Every process of a run (the schedulers, the submitter, the fake backend inside each
scheduler) reads one *scaled clock*: trace seconds = (wall time - origin) x speed, from the same
host clock and the same two numbers (given to the schedulers in the environment, installed by
their ``sitecustomize``). It needs no coordination, never goes back, and is the same in every
process at every instant, so a new leader sees exactly the attempts' timeline the killed one
saw. What stays in wall time is what the service measures in wall time: the lease, the idle
wait (``--poll-seconds``), the database back-off, process starts, so a takeover of 2 s costs
``2 x speed`` trace seconds, which is what makes this a stress and not a replay: decisions
depend on how fast the service keeps up, so they are not compared with the simulator here (the
clean run, ``benchmarks/service_trace.py``, does that on a virtual clock). The one place the
service sleeps for a clock difference, the poller's pause until its next due poll, sees none:
the fake backend is polled every round (interval 0), and a round starts at most every
``poll_round`` wall seconds (``polling.MIN_ROUND_SECONDS``, set by the hook).
"""

from __future__ import annotations

import json
import random
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import DBAPIError

from airflow_quota.core.config import QuotaConfig, parse_config
from airflow_quota.core.model import JobRequest, PreferenceEntry
from airflow_quota.exceptions import DatabaseUnavailable
from airflow_quota.store.engine import make_engine
from airflow_quota.store.models import EventRow, JobRow, Leader
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize
from tests.postgres import Server
from tests.service.chaos import FINAL, Env, Scheduler, Watcher, check_books, invariant_problems, prepared
from tests.waiting import wait_for

RETRY_ATTEMPTS = 4
"""Each trace job's ``retry_attempts``: a start the fake backend fails (an injected fault) is a
failed attempt, retried as a real platform retries a failed API call; four attempts make a job
that fails for good unlikely (0.02^4), not impossible (the run counts them)."""

CHAOS_HOOK = textwrap.dedent(
    """
    import os, random, time
    if "QUOTA_CHAOS_SPEED" in os.environ:
        from airflow_quota.service import clock as _clock, polling as _polling
        from airflow_quota.service.backends import fake as _chaos_fake
        from airflow_quota.service.backends.base import BackendError

        _speed = float(os.environ["QUOTA_CHAOS_SPEED"])
        _origin = float(os.environ["QUOTA_CHAOS_ORIGIN"])

        def _scaled_now(self):
            return (time.time() - _origin) * _speed

        _clock.WallClock.now = _scaled_now
        _polling.MIN_ROUND_SECONDS = float(os.environ["QUOTA_CHAOS_ROUND"])
        _rate = float(os.environ["QUOTA_CHAOS_FAULT_RATE"])
        _draws = random.Random(os.environ["QUOTA_CHAOS_SEED"])
        _faults = os.environ["QUOTA_CHAOS_FAULTS"]

        def _failing(name, call):
            def call_or_fail(self, attempt, *args, **kwargs):
                if _draws.random() < _rate:
                    with open(_faults, "a") as journal:
                        journal.write(name + " " + attempt.key + "\\n")
                    raise BackendError("injected fault: " + name + " of " + attempt.key)
                return call(self, attempt, *args, **kwargs)
            return call_or_fail

        for _name in ("start", "stop", "poll"):
            setattr(_chaos_fake.FakeBackend, _name, _failing(_name, getattr(_chaos_fake.FakeBackend, _name)))
    """
)
"""Appended to ``chaos.JOURNAL_HOOK`` in the schedulers' ``sitecustomize``: the scaled clock,
the poller's round, and the fake backend's injected faults (seeded per process)."""


# -- the trace ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of the trace as the run submits it: when (trace seconds), where and how long."""

    name: str
    share: str
    instance_type: str
    count: int
    submit: float
    duration: float

    def request(self) -> JobRequest:
        entry = PreferenceEntry(instance_type=self.instance_type, count=self.count)
        return JobRequest(
            name=self.name, share=self.share, priority=0, preferences=[entry], retry_attempts=RETRY_ATTEMPTS
        )


def itp_jobs(jobs: int | None, duration_scale: float = 1.0) -> tuple[dict[str, Any], list[TraceJob]]:
    """The ITP quota (``benchmarks/itp_replay.py``) and the first ``jobs`` jobs of the trace
    mapped onto it (all for None), their durations times ``duration_scale``."""
    from airflow_quota.sim.traces import map_rows
    from benchmarks.itp_replay import first_jobs, itp_quota

    quota = itp_quota()
    placed, problems = map_rows(first_jobs(jobs), parse_config(quota))
    assert not problems, problems[:5]
    return quota, [
        TraceJob(p.row.name, p.share, p.instance_type, p.count, p.row.submit, p.row.duration * duration_scale)
        for p in placed
    ]


# -- the clock and the processes ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaledClock:
    """Trace seconds = (wall time - ``origin``) x ``speed``; what the hook gives the schedulers."""

    origin: float
    speed: float

    def now(self) -> float:
        return (time.time() - self.origin) * self.speed

    def wall_seconds(self, trace_seconds: float) -> float:
        return trace_seconds / self.speed


class ChaosEnv(Env):
    """``chaos.Env`` whose schedulers also load ``CHAOS_HOOK``: each gets the run's clock and
    fault rate, and a seed of its own (the run's seed and its number)."""

    def __init__(self, url: str, root: Path, clock: ScaledClock, fault_rate: float, poll_round: float, seed: int):
        self.clock, self.fault_rate, self.poll_round, self.seed = clock, fault_rate, poll_round, seed
        self.started = 0
        super().__init__(url, root)
        hook = self.root / "hook" / "sitecustomize.py"
        hook.write_text(hook.read_text() + CHAOS_HOOK)

    @property
    def faults(self) -> Path:
        return self.root / "injected-faults.txt"

    def environ(self) -> dict[str, str]:
        self.started += 1
        return dict(
            super().environ(),
            QUOTA_CHAOS_SPEED=repr(self.clock.speed),
            QUOTA_CHAOS_ORIGIN=repr(self.clock.origin),
            QUOTA_CHAOS_ROUND=repr(self.poll_round),
            QUOTA_CHAOS_FAULT_RATE=repr(self.fault_rate),
            QUOTA_CHAOS_SEED=f"{self.seed}-{self.started}",
            QUOTA_CHAOS_FAULTS=str(self.faults),
        )

    def injected(self) -> Counter[str]:
        """How many faults were injected, per call (start, stop, poll)."""
        if not self.faults.exists():
            return Counter()
        return Counter(line.split()[0] for line in self.faults.read_text().splitlines() if line.strip())


# -- the submitter --------------------------------------------------------------------------


class Submitter(threading.Thread):
    """Submits the jobs in order, each once the clock reaches its trace time (``offset`` + its
    submit); behind, it submits as fast as it can (``lag`` says how far behind it fell). A
    database error (the server restarting) is waited out and the job submitted again with its
    name as client token, so a submission whose commit was not acknowledged is not doubled."""

    def __init__(self, url: str, jobs: list[TraceJob], clock: ScaledClock, offset: float) -> None:
        super().__init__(daemon=True)
        self.url, self.jobs, self.clock, self.offset = url, jobs, clock, offset
        self.submitted = 0
        self.lag = 0.0
        """The most trace seconds a submission came after its trace time."""
        self.retries = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        engine = make_engine(normalize(self.url), pool_size=1)
        store = QuotaStore(engine, clock=self.clock.now)
        try:
            for job in self.jobs:
                due = self.offset + job.submit
                while not self._halt.is_set() and (ahead := due - self.clock.now()) > 0:
                    self._halt.wait(min(self.clock.wall_seconds(ahead), 0.2))
                if self._halt.is_set():
                    return
                self.lag = max(self.lag, self.clock.now() - due)
                self._submit(store, engine, job)
                self.submitted += 1
        except BaseException as exc:  # reported by the run, not lost in a thread
            self.error = exc
        finally:
            engine.dispose()

    def _submit(self, store: QuotaStore, engine: Engine, job: TraceJob) -> None:
        while True:
            try:
                store.submit(job.request(), "fake", {"duration": job.duration}, client_token=job.name)
                return
            except (DBAPIError, DatabaseUnavailable):
                if self._halt.is_set():
                    raise
                self.retries += 1
                engine.dispose()
                self._halt.wait(0.5)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


class Submitters:
    """``count`` submitters side by side, each taking every ``count``-th job in order (one
    submitter makes about 20 submissions a second on a loaded 2-core machine, too few for the
    whole trace at its speed); as one ``Submitter`` to the run."""

    def __init__(self, url: str, jobs: list[TraceJob], clock: ScaledClock, offset: float, count: int = 1) -> None:
        self.threads = [Submitter(url, jobs[index::count], clock, offset) for index in range(count)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for thread in self.threads:
            thread.stop()

    def is_alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    @property
    def error(self) -> BaseException | None:
        return next((thread.error for thread in self.threads if thread.error is not None), None)

    @property
    def submitted(self) -> int:
        return sum(thread.submitted for thread in self.threads)

    @property
    def lag(self) -> float:
        return max(thread.lag for thread in self.threads)

    @property
    def retries(self) -> int:
        return sum(thread.retries for thread in self.threads)


# -- the decision log -----------------------------------------------------------------------


@dataclass
class LogAudit:
    """The invariant replayed from the decision log: ``steps`` groups of decisions checked (one
    committed step each), ``events`` rows read, what broke it, and what was still held at the end."""

    steps: int = 0
    events: int = 0
    problems: list[str] = field(default_factory=list)
    held_at_end: dict[str, int] = field(default_factory=dict)
    """Instances the log still shows held (by job name): none once every job has ended."""
    kinds: Counter[str] = field(default_factory=Counter)
    """Decisions by type (PLACED, PREEMPTED, REQUEUED...): how much the run exercised."""


def audit_log(engine: Engine, config: QuotaConfig, batch: int = 5000) -> LogAudit:
    """Replay the decision log and check the invariant after each committed step.

    A step's decisions share their time and their leader's epoch and are committed together, so
    each run of consecutive rows with the same (``at``, ``leader_epoch``) is one step: after it,
    each (share, type)'s usage is what its jobs were PLACED and have not given back (PREEMPTED,
    REQUEUED, SUCCEEDED, FAILED), and ``invariant_problems`` checks it (usage within the pool,
    borrowed within what is lendable, each share within its cap). A victim preempted with a grace
    keeps its instances busy until it stops (requeued or ended): those count against the
    capacity too (rule 4.0.1.3). A job PLACED while the log says it holds capacity is a problem."""
    audit = LogAudit()
    holding: dict[int | str, tuple[str, str, int]] = {}
    draining: dict[int | str, tuple[str, int]] = {}
    names: dict[int | str, str] = {}
    capacity = config.pool.capacity

    def check(at: float) -> None:
        usage: Counter[tuple[str, str]] = Counter()
        for share, instance_type, count in holding.values():
            usage[(share, instance_type)] += count
        problems = invariant_problems(config, dict(usage))
        for instance_type, busy in Counter({t: n for t, n in draining.values()}).items():
            used = sum(n for (_, t), n in usage.items() if t == instance_type)
            if used + busy > capacity.get(instance_type, 0):
                problems.append(f"{instance_type}: used {used} + stopping {busy} > capacity {capacity[instance_type]}")
        audit.problems += [f"step at {at:.0f}: {p}" for p in problems]

    last: tuple[float, int | None] | None = None
    for row in _events(engine, batch):
        key: int | str = row.job_id if row.job_id is not None else row.job
        if last is not None and (row.at, row.leader_epoch) != last:
            audit.steps += 1
            check(last[0])
        last = (row.at, row.leader_epoch)
        audit.events += 1
        names[key] = row.job
        kind = row.type
        audit.kinds[kind] += 1
        if kind == "PLACED":
            if key in holding:
                audit.problems.append(f"{row.job} placed at {row.at:.0f} while it holds {holding[key]}")
            holding[key] = (row.share, row.record["instance_type"], int(row.record["count"]))
        elif kind == "PREEMPTED":
            held = holding.pop(key, None)
            if held is not None and float(row.record.get("grace_seconds") or 0) > 0:
                draining[key] = (held[1], held[2])
        elif kind in ("REQUEUED", "SUCCEEDED", "FAILED"):
            holding.pop(key, None)
            draining.pop(key, None)
    if last is not None:
        audit.steps += 1
        check(last[0])
    audit.held_at_end = {names[k]: count for k, (_, _, count) in holding.items()}
    return audit


def _events(engine: Engine, batch: int) -> Iterator[Any]:
    """The decision log in order, read in batches of ``batch`` rows by id."""
    after = 0
    columns = (EventRow.id, EventRow.at, EventRow.type, EventRow.job, EventRow.job_id, EventRow.share)
    while True:
        with engine.connect() as c:
            rows = c.execute(
                select(*columns, EventRow.record, EventRow.leader_epoch)
                .where(EventRow.id > after)
                .order_by(EventRow.id)
                .limit(batch)
            ).all()
        if not rows:
            return
        yield from rows
        after = rows[-1].id


# -- the run --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChaosSettings:
    jobs: int | None
    """The first ``jobs`` jobs of the trace (all for None)."""
    speed: float
    """Trace seconds per wall second."""
    seed: int = 39
    kills: int = 5
    restarts: int = 1
    fault_rate: float = 0.02
    duration_scale: float = 1.0
    lease_seconds: float = 10.0
    """The schedulers' ``--lease-seconds`` (10, the default; a SIGKILLed leader's lease is taken
    over as soon as its connection is gone, without waiting for it to run out)."""
    outage_seconds: float = 2.0
    """How long the PostgreSQL server stays down at its restart."""
    poll_round: float = 0.2
    timeout: float = 3600.0
    """Wall seconds for every job to end, after the last submission."""
    submitters: int = 1
    """Submitter threads side by side (``Submitters``)."""


@dataclass
class Fault:
    kind: str
    """``kill`` or ``restart``."""
    at_fraction: float
    """When: once this fraction of the jobs has ended."""
    trace_day: float = 0.0
    lease_taken_after: float | None = None
    """Wall seconds from the kill to a new lease epoch; for a restart, from the server answering
    again, and None when the leader kept its lease through the outage."""
    decision_after: float | None = None
    """Wall seconds from the kill (or the server answering again) to the first decision after."""


@dataclass
class ChaosResult:
    settings: ChaosSettings
    jobs: int = 0
    wall_seconds: float = 0.0
    trace_days: float = 0.0
    decisions: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    injected: dict[str, int] = field(default_factory=dict)
    submit_lag_seconds: float = 0.0
    submit_retries: int = 0
    books: dict[str, Any] = field(default_factory=dict)
    audit: LogAudit = field(default_factory=LogAudit)
    watcher_samples: int = 0
    watcher_violations: list[str] = field(default_factory=list)
    tracebacks: int = 0
    problems: list[str] = field(default_factory=list)
    """What the end checks found; empty when the run passed."""

    def summary(self) -> dict[str, Any]:
        return {
            "settings": asdict(self.settings),
            "jobs": self.jobs,
            "wall_seconds": round(self.wall_seconds, 1),
            "trace_days": round(self.trace_days, 2),
            "decisions": self.decisions,
            "decisions_per_second": round(self.decisions / self.wall_seconds, 1) if self.wall_seconds else None,
            "outcomes": self.outcomes,
            "faults": [vars(f) for f in self.faults],
            "injected_backend_faults": self.injected,
            "submit_lag_trace_seconds": round(self.submit_lag_seconds),
            "submit_retries": self.submit_retries,
            "books": self.books,
            "log_audit": {
                "steps": self.audit.steps,
                "events": self.audit.events,
                "decisions": dict(self.audit.kinds),
                "problems": self.audit.problems[:10],
            },
            "watcher": {"samples": self.watcher_samples, "violations": self.watcher_violations[:10]},
            "tracebacks_in_scheduler_logs": self.tracebacks,
            "problems": self.problems,
        }


def plan_faults(settings: ChaosSettings) -> list[Fault]:
    """The seeded moments, as fractions of the jobs ended (so they fall at the same point of the
    trace whatever the machine's speed), between 5 % and 90 %, in order."""
    rng = random.Random(settings.seed)
    kinds = ["kill"] * settings.kills + ["restart"] * settings.restarts
    moments = sorted(rng.uniform(0.05, 0.9) for _ in kinds)
    rng.shuffle(kinds)
    return [Fault(kind, round(at, 3)) for kind, at in zip(kinds, moments, strict=True)]


Progress = Callable[[dict[str, Any]], None]


def run_chaos(
    settings: ChaosSettings, root: Path, progress: Progress | None = None, every: float = 10.0
) -> ChaosResult:
    """The whole run on a server of its own, in ``root``; the checks' findings in ``problems``."""
    quota, jobs = itp_jobs(settings.jobs, settings.duration_scale)
    result = ChaosResult(settings, jobs=len(jobs))
    server = Server()
    server.start()
    running: list[Scheduler] = []
    try:
        _run(settings, root, server, quota, jobs, result, running, progress, every)
    finally:
        for scheduler in running:
            if scheduler.alive():
                scheduler.kill()
        server.remove()
    return result


def _run(
    settings: ChaosSettings,
    root: Path,
    server: Server,
    quota: dict[str, Any],
    jobs: list[TraceJob],
    result: ChaosResult,
    running: list[Scheduler],
    progress: Progress | None,
    every: float,
) -> None:
    url = server.url
    clock = ScaledClock(time.time(), settings.speed)
    env = ChaosEnv(url, root, clock, settings.fault_rate, settings.poll_round, settings.seed)
    engine, _ = prepared(url, quota)
    config = parse_config(quota)
    extra = ("--lease-seconds", str(settings.lease_seconds))
    running += [Scheduler(env, *extra), Scheduler(env, *extra)]
    wait_for(lambda: all(_ready(s) for s in running), 120, "a leader and a standby")
    watcher = Watcher(url, config, interval=0.2).start()
    offset = clock.now()
    submitter = Submitters(url, jobs, clock, offset, settings.submitters)
    started = time.monotonic()
    submitter.start()
    faults = plan_faults(settings)
    pending = list(faults)
    last_report = 0.0
    last_decisions = (started, 0)
    deadline: float | None = None
    try:
        while True:
            ended, decisions = _progress(engine)
            now = time.monotonic()
            if submitter.error is not None:
                raise RuntimeError(f"the submitter failed: {submitter.error!r}") from submitter.error
            if pending and ended >= pending[0].at_fraction * len(jobs):
                fault = pending.pop(0)
                fault.trace_day = (clock.now() - offset) / 86400
                if fault.kind == "kill":
                    _kill_leader(env, engine, running, fault, extra)
                else:
                    _restart(server, engine, fault, settings.outage_seconds)
                result.faults.append(fault)
                continue
            if progress is not None and now - last_report >= every:
                rate = (decisions - last_decisions[1]) / max(now - last_decisions[0], 1e-9)
                last_report, last_decisions = now, (now, decisions)
                progress(
                    {
                        "wall": now - started,
                        "day": (clock.now() - offset) / 86400,
                        "submitted": submitter.submitted,
                        "ended": ended,
                        "jobs": len(jobs),
                        "decisions_per_second": rate,
                        "faults": len(result.faults),
                    }
                )
            if ended == len(jobs) and not pending:
                break
            if deadline is None and not submitter.is_alive():
                deadline = now + settings.timeout
            if deadline is not None and now > deadline:
                result.problems.append(
                    f"{len(jobs) - ended} jobs had not ended {settings.timeout:.0f} s after the last submission "
                    f"(faults still to come: {[f.kind for f in pending]})"
                )
                break
            time.sleep(0.25)
    finally:
        submitter.stop()
        watcher.stop()
    result.watcher_samples, result.watcher_violations = watcher.samples, watcher.violations
    if watcher.violations:
        result.problems.append(f"the watcher saw the invariant broken: {watcher.violations[:5]}")
    result.wall_seconds = time.monotonic() - started
    result.trace_days = (clock.now() - offset) / 86400
    result.submit_lag_seconds, result.submit_retries = submitter.lag, submitter.retries
    _finish(env, engine, config, running, result)
    engine.dispose()


def _ready(scheduler: Scheduler) -> bool:
    return scheduler.alive() and ("waits as standby" in scheduler.log() or scheduler.leads())


def _progress(engine: Engine) -> tuple[int, int]:
    """(jobs ended, decisions committed), tolerating the server's restart."""
    try:
        with engine.connect() as c:
            ended = c.scalar(select(func.count()).select_from(JobRow).where(JobRow.state.in_(FINAL)))
            decisions = c.scalar(select(func.max(EventRow.id)))
        return int(ended or 0), int(decisions or 0)
    except DBAPIError:
        engine.dispose()
        return -1, 0


def _lease(engine: Engine) -> tuple[str | None, int]:
    with engine.connect() as c:
        row = c.execute(select(Leader.holder, Leader.epoch)).first()
    return (row.holder, int(row.epoch)) if row is not None else (None, 0)


def _decided_under(engine: Engine, epoch: int) -> bool:
    """Whether a decision was committed under a lease epoch after ``epoch``."""
    try:
        with engine.connect() as c:
            return c.scalar(select(EventRow.id).where(EventRow.leader_epoch > epoch).limit(1)) is not None
    except DBAPIError:
        engine.dispose()
        return False


def _kill_leader(env: ChaosEnv, engine: Engine, running: list[Scheduler], fault: Fault, extra: tuple[str, ...]) -> None:
    """SIGKILL the leader, start its replacement (the next standby) at once, and time how soon
    a standby takes the lease and commits its first decision."""

    def leading() -> tuple[Scheduler, int] | None:
        holder, epoch = _lease(engine)
        return next(((s, epoch) for s in running if s.holder == holder and s.alive()), None)

    wait_for(lambda: leading() is not None, 60, "one of the schedulers to lead")
    found = leading()
    assert found is not None
    leader, epoch = found
    killed = time.monotonic()
    leader.kill()  # SIGKILL, and reaped
    running.remove(leader)
    running.append(Scheduler(env, *extra))
    wait_for(lambda: _lease(engine)[1] > epoch, 120, "a standby to take the lease")
    fault.lease_taken_after = round(time.monotonic() - killed, 2)
    wait_for(lambda: _decided_under(engine, epoch), 120, "the new leader's first decision")
    fault.decision_after = round(time.monotonic() - killed, 2)


def _restart(server: Server, engine: Engine, fault: Fault, outage: float) -> None:
    """Stop the server (fast: every session ends), keep it down ``outage`` seconds, start it,
    and time how soon a decision is committed after it answers."""
    _, epoch_before = _lease(engine)
    with engine.connect() as c:
        last = int(c.scalar(select(func.max(EventRow.id))) or 0)
    engine.dispose()
    server.stop()
    time.sleep(outage)  # the outage: a fixed length, as a real restart has
    server.start()
    back = time.monotonic()
    wait_for(server.answers, 30, "the server to answer")

    def decided() -> bool:
        try:
            with engine.connect() as c:
                return int(c.scalar(select(func.max(EventRow.id))) or 0) > last
        except DBAPIError:
            engine.dispose()
            return False

    wait_for(decided, 120, "a decision after the restart")
    fault.decision_after = round(time.monotonic() - back, 2)
    if _lease(engine)[1] > epoch_before:  # the leader lost its lease in the outage: a takeover
        fault.lease_taken_after = fault.decision_after


def _finish(env: ChaosEnv, engine: Engine, config: QuotaConfig, running: list[Scheduler], result: ChaosResult) -> None:
    """The end checks: the books, the log's invariant, the watcher's samples, the logs."""
    with engine.connect() as c:
        result.outcomes = {s: int(n) for s, n in c.execute(select(JobRow.state, func.count()).group_by(JobRow.state))}
        result.decisions = int(c.scalar(select(func.count()).select_from(EventRow)) or 0)
    result.injected = dict(env.injected())
    if not result.problems:  # the books of a run that did not end are not worth reading
        try:
            result.books = check_books(env, engine, result.jobs, all_succeed=False)
        except AssertionError as exc:
            result.problems.append(f"books: {exc}")
    result.audit = audit_log(engine, config)
    result.problems += result.audit.problems[:20]
    if result.audit.held_at_end:
        result.problems.append(
            f"the log shows capacity still held at the end: {dict(list(result.audit.held_at_end.items())[:10])}"
        )
    for scheduler in running:
        if scheduler.alive():
            scheduler.terminate()
    logs = [path.read_text() for path in sorted(env.root.glob("scheduler-*.log"))]
    result.tracebacks = sum(log.count("Traceback") for log in logs)
    if result.tracebacks:
        result.problems.append(f"{result.tracebacks} tracebacks in the schedulers' logs")
    (env.root / "result.json").write_text(json.dumps(result.summary(), indent=2))
