"""The machinery of the crash, fault and soak tests (``test_crash_recovery``,
``test_database_faults``, ``test_soak``, ``test_cli_service``): ``airflow-quota scheduler``
subprocesses, a watcher sampling the database, and ``check_books``, the end-of-run audit.

What "nothing lost, nothing twice, nothing leaked" means here, checked by ``check_books``:

- every job ends exactly once: one SUCCEEDED or FAILED row per job in ``quota_events``, and the
  job row is final;
- no attempt started twice: the fake backend keeps one state file per attempt key, written once;
  every ``quota_attempts`` row has one, except an attempt preempted in the cycle that placed it;
  a journal (a ``sitecustomize`` loaded only by the scheduler subprocesses, wrapping
  ``FakeBackend.start``) records every start call and whether it created the attempt, and no key
  is created twice; the attempts of one job never overlap in time; the keys the backend knows
  are exactly the ``quota_attempts`` rows;
- no capacity leaked: no attempt row without ``ended_at`` or with a pending action, and
  ``airflow-quota shares --json`` shows ``used`` 0 everywhere;
- the invariant of ``docs/model.md`` section 4 holds, sampled throughout by a watcher thread with
  its own engine (``Watcher``), which must have taken samples for that to mean anything
  (``Watcher.assert_held``).

The ``schedulers`` fixture that kills every scheduler a test started is in ``conftest.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import textwrap
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select, text

from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.model import JobRequest
from airflow_quota.core.quota import TypeLedger, holding_cap
from airflow_quota.service.backends.base import STOPPED_BEFORE_START
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import Attempt, EventRow, JobRow, Leader
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize
from tests.builders import request
from tests.conftest import CLI, ROOT, cli
from tests.waiting import wait_for

HOLDING = ("SCHEDULED", "STARTING", "RUNNING")
FINAL = ("SUCCEEDED", "FAILED")

POOL: dict[str, Any] = {
    "pool": {"capacity": {"ml.g5.xlarge": 12, "ml.g5.2xlarge": 6}},
    "shares": [
        {
            "name": "research",
            "capacity_limits": {"ml.g5.xlarge": 4, "ml.g5.2xlarge": 2},
            "strategy": "LEND_AND_BORROW",
            "borrow_limit": 200,
            "in_share_preemption": True,
            "in_share_preemption_after_seconds": 0,  # preempts at once: these tests are about preemption
        },
        {"name": "prod", "capacity_limits": {"ml.g5.xlarge": 4, "ml.g5.2xlarge": 2}, "strategy": "LEND"},
        {"name": "critical", "capacity_limits": {"ml.g5.xlarge": 2, "ml.g5.2xlarge": 2}, "strategy": "RESERVE"},
    ],
}
"""A pool where borrowing, reclaim and in-share preemption all happen (2 xlarge unassigned)."""

# Loaded by the scheduler subprocesses only (PYTHONPATH): journals every FakeBackend.start call,
# "fresh" when that call created the attempt's record (the backend's own atomic create: a start
# that read no record before it, and lost the race to another scheduler's start, is not fresh).
JOURNAL_HOOK = textwrap.dedent(
    """
    import json, os, threading, time
    from airflow_quota.service.backends import fake as _fake

    _start, _create = _fake.FakeBackend.start, _fake.FakeBackend._create
    _created = threading.local()

    def _journalled_create(self, key, state):
        made = _create(self, key, state)
        _created.fresh = made and not state.get("tombstone")
        return made

    def _journalled_start(self, attempt):
        _created.fresh = False
        _start(self, attempt)
        line = json.dumps({"key": attempt.key, "pid": os.getpid(), "fresh": _created.fresh, "at": time.time()})
        with open(os.environ["QUOTA_TEST_JOURNAL"], "a") as journal:
            journal.write(line + "\\n")

    _fake.FakeBackend._create = _journalled_create
    _fake.FakeBackend.start = _journalled_start
    """
)


# -- processes ------------------------------------------------------------------------------


@dataclass
class Env:
    """Where one test's schedulers keep their state: the database, the fake backend's files,
    the start journal and the logs."""

    url: str
    root: Path

    def __post_init__(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        hook = self.root / "hook"
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text(JOURNAL_HOOK)

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def fake_dir(self) -> Path:
        return self.state_dir / "fake"

    @property
    def journal(self) -> Path:
        return self.root / "starts.jsonl"

    def environ(self) -> dict[str, str]:
        path = os.pathsep.join([str(self.root / "hook"), str(ROOT), os.environ.get("PYTHONPATH", "")])
        return dict(os.environ, PYTHONPATH=path, QUOTA_TEST_JOURNAL=str(self.journal), PYTHONUNBUFFERED="1")

    def starts(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]


class Scheduler:
    """``airflow-quota scheduler`` as a subprocess, its log in a file."""

    count = 0

    def __init__(self, env: Env, *extra: str, poll_seconds: float = 0.05) -> None:
        Scheduler.count += 1
        self.log_path = env.root / f"scheduler-{Scheduler.count}.log"
        self._log = self.log_path.open("w")
        command = [*CLI, "scheduler", "--db", env.url, "--state-dir", str(env.state_dir)]
        command += ["--poll-seconds", str(poll_seconds), *extra]
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env.environ())
        self.holder = f"{socket.gethostname()}:{self.proc.pid}"

    def log(self) -> str:
        return self.log_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_log(self, needle: str, timeout: float = 20.0) -> None:
        wait_for(lambda: needle in self.log() or not self.alive(), timeout, f"{needle!r} in the scheduler log")
        assert needle in self.log(), f"the scheduler exited ({self.proc.returncode}) without {needle!r}:\n{self.log()}"

    def leads(self) -> bool:
        return "leads the quota scheduler" in self.log()

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._log.close()

    def terminate(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self._log.close()
        return code


def cli_json(url: str, *args: str) -> Any:
    """What ``airflow-quota ARGS --db URL --json`` prints, parsed; the command must succeed."""
    run = cli(*args, "--db", url, "--json")
    assert run.code == 0, run
    return run.json()


# -- the database ---------------------------------------------------------------------------


def prepared(url: str, config: dict[str, Any] = POOL) -> tuple[Engine, QuotaStore]:
    """Migrate the database and apply ``config``; the engine and a store for submitting."""
    engine = make_engine(normalize(url))
    migrate(engine)
    store = QuotaStore(engine)
    store.apply_config(config, source="test")
    return engine, store


PREFERENCES: list[tuple[tuple[str, int], ...]] = [
    (("ml.g5.xlarge", 1),),
    (("ml.g5.xlarge", 2),),
    (("ml.g5.2xlarge", 1), ("ml.g5.xlarge", 1)),
]
"""The preference lists of the random jobs: one or two xlarge, or a 2xlarge before an xlarge."""


def random_request(rng: random.Random, name: str) -> JobRequest:
    """A job in a random share of ``POOL`` (research twice as often), with random preferences
    and a priority from 1 to 5."""
    share = rng.choice(["research", "research", "prod", "critical"])
    preferences = rng.choice(PREFERENCES)
    return request(name, share, *preferences, priority=rng.randint(1, 5))


def submit_many(
    store: QuotaStore, prefix: str, n: int, duration: float | Callable[[int], float], seed: int = 1
) -> None:
    """``n`` fake jobs spread over the shares, types, counts and priorities of ``POOL``."""
    rng = random.Random(seed)
    for i in range(n):
        seconds = duration(i) if callable(duration) else duration
        store.submit(random_request(rng, f"{prefix}-{i}"), "fake", {"duration": seconds})


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as c:
        states = dict(c.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all())
        pending = c.scalar(select(func.count()).select_from(Attempt).where(Attempt.action.is_not(None)))
        open_ = c.scalar(select(func.count()).select_from(Attempt).where(Attempt.ended_at.is_(None)))
        running = c.scalar(select(func.count()).select_from(Attempt).where(Attempt.status == "RUNNING"))
    return {
        **states,
        "pending_actions": int(pending or 0),
        "open_attempts": int(open_ or 0),
        "running_attempts": int(running or 0),
    }


def all_final(engine: Engine, jobs: int) -> Callable[[], bool]:
    def done() -> bool:
        with engine.connect() as c:
            final = c.scalar(select(func.count()).select_from(JobRow).where(JobRow.state.in_(FINAL)))
            open_ = c.scalar(select(func.count()).select_from(Attempt).where(Attempt.ended_at.is_(None)))
        return final == jobs and open_ == 0

    return done


# -- the invariant --------------------------------------------------------------------------


def invariant_problems(config: QuotaConfig, holding: dict[tuple[str, str], int]) -> list[str]:
    """``docs/model.md`` section 4 for the usage ``holding`` ((share, type) -> instances): Σ U ≤ capacity,
    borrowed ≤ lendable, and each share within its holding cap."""
    problems = []
    shares = {s.name: s for s in config.shares}
    for name, capacity in config.pool.capacity.items():
        ledger = TypeLedger.of(config, name, {s: n for (s, t), n in holding.items() if t == name})
        if ledger.used > capacity:
            problems.append(f"{name}: used {ledger.used} > capacity {capacity} ({ledger.usage})")
        if ledger.borrowed() > ledger.lendable():
            problems.append(f"{name}: borrowed {ledger.borrowed()} > lendable {ledger.lendable()} ({ledger.usage})")
        for share, used in ledger.usage.items():
            cap = holding_cap(shares[share], ledger.limit_of(share)) if share in shares else 0
            if cap is not None and used > cap:
                problems.append(f"{name}: share {share} holds {used} > its cap {cap}")
    for (share, name), used in holding.items():
        if name not in config.pool.capacity and used:
            problems.append(f"{share} holds {used} of {name}, which is not in the pool")
    return problems


def holding_now(engine: Engine) -> dict[tuple[str, str], int]:
    """Usage per (share, type) from the job rows in one statement (one consistent read)."""
    query = (
        select(JobRow.share, JobRow.instance_type, func.sum(JobRow.count))
        .where(JobRow.state.in_(HOLDING))
        .group_by(JobRow.share, JobRow.instance_type)
    )
    with engine.connect() as c:
        return {(s, t): int(n or 0) for s, t, n in c.execute(query).all() if t is not None}


@dataclass
class Watcher:
    """Samples the database in a thread with its own engine: the invariant on the job rows, and
    who leads. ``stop()`` returns after the last sample."""

    url: str
    config: QuotaConfig
    interval: float = 0.05
    samples: int = 0
    busiest: int = 0
    violations: list[str] = field(default_factory=list)
    leaders: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        engine = make_engine(normalize(self.url), pool_size=1)
        try:
            while not self._stop.is_set():
                try:
                    holding = holding_now(engine)
                    with engine.connect() as c:
                        leader = c.scalar(select(Leader.holder))
                except Exception as exc:  # a sample that fails is reported, not fatal
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    self._stop.wait(self.interval)
                    continue
                self.samples += 1
                self.busiest = max(self.busiest, sum(holding.values()))
                for problem in invariant_problems(self.config, holding):
                    self.violations.append(f"sample {self.samples}: {problem}")
                if leader and (not self.leaders or self.leaders[-1] != leader):
                    self.leaders.append(leader)
                self._stop.wait(self.interval)
        finally:
            engine.dispose()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the watcher did not stop within 30 s"

    def assert_held(self, at_least: int = 20) -> None:
        """The invariant held in every sample, and the watcher took at least ``at_least``
        samples: a watcher that never ran, or whose every read failed, sees no violation
        either. The default, 20 samples (a second at 0.05 s), is far below what any run here
        gives; a test that runs longer asks for more."""
        assert self.samples >= at_least, (
            f"the watcher took {self.samples} samples, fewer than {at_least}: the invariant was hardly "
            f"watched (failed reads: {self.errors[:5]})"
        )
        assert not self.violations, self.violations[:5]


# -- the books ------------------------------------------------------------------------------


def fake_attempts(env: Env) -> dict[str, dict[str, Any]]:
    if not env.fake_dir.exists():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in env.fake_dir.glob("*.json") if not p.name.startswith(".")}


def _fake_interval(state: dict[str, Any]) -> tuple[float, float]:
    started = float(state["started_at"])
    end = started + float(state["training"].get("startup", 0)) + float(state["work"])
    if state["stop_at"] is not None:
        end = min(end, float(state["stop_at"]))
    return started, end


def _story(engine: Engine, key: str) -> str:
    """An attempt's row and its job's decisions, for failure messages."""
    job_id, number = (int(part) for part in key.split("-"))
    with engine.connect() as c:
        attempt = c.execute(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number)).first()
        name = c.scalar(select(JobRow.name).where(JobRow.id == job_id))
        lines = c.scalars(select(EventRow.line).where(EventRow.job == name).order_by(EventRow.id)).all()
    return f"attempt {key}: {attempt and dict(attempt._mapping)}; job {name}: {list(lines)}"


def check_books(env: Env, engine: Engine, jobs: int, *, all_succeed: bool = True) -> dict[str, Any]:
    """Everything the module docstring promises, at the end of a run; returns a few figures."""
    with engine.connect() as c:
        rows = c.execute(select(JobRow.id, JobRow.name, JobRow.state, JobRow.reason, JobRow.detail)).all()
        ends = c.execute(select(EventRow.job, EventRow.type).where(EventRow.type.in_(FINAL))).all()
        attempts = c.execute(
            select(Attempt.job_id, Attempt.number, Attempt.ended_at, Attempt.action, Attempt.status)
        ).all()
        duplicates = c.execute(
            text("SELECT job_id, number, count(*) FROM quota_attempts GROUP BY job_id, number HAVING count(*) > 1")
        ).all()
    assert len(rows) == jobs, f"{len(rows)} job rows for {jobs} submitted jobs"
    not_final = [(r.name, r.state) for r in rows if r.state not in FINAL]
    assert not not_final, f"jobs that never ended: {not_final[:10]}"
    if all_succeed:
        failed = [(r.name, r.state, r.reason, r.detail) for r in rows if r.state != "SUCCEEDED"]
        assert not failed, f"jobs that did not succeed: {failed[:10]}"
    per_job = Counter(job for job, _ in ends)
    wrong = {r.name: per_job.get(r.name, 0) for r in rows if per_job.get(r.name, 0) != 1}
    assert not wrong, f"jobs without exactly one SUCCEEDED/FAILED event: {dict(list(wrong.items())[:10])}"

    assert not duplicates, f"duplicate attempt rows: {duplicates}"
    still_open = [(a.job_id, a.number, a.status, a.action) for a in attempts if a.ended_at is None or a.action]
    assert not still_open, f"attempts left open or with a pending action: {still_open[:10]}"
    keys = {f"{a.job_id}-{a.number}" for a in attempts}
    files = fake_attempts(env)
    # An attempt stopped before its start began is never started: placed and preempted in the
    # same cycle (its START is dropped before anything is done), or preempted or cancelled while
    # its start still waited in the poller (the STOP replaces it). Those end StoppedBeforeStart,
    # one of the two kinds of row the backend may not know (the other: a start it refused).
    with engine.connect() as c:
        stopped_first = {
            f"{job_id}-{number}"
            for job_id, number in c.execute(
                select(Attempt.job_id, Attempt.number).where(Attempt.reason == STOPPED_BEFORE_START)
            ).all()
        }
        # A start the backend refused (its call raised: an injected fault, an API error) never
        # started either: the attempt failed with the error as its reason, without running.
        start_failed = {
            f"{job_id}-{number}"
            for job_id, number in c.execute(
                select(Attempt.job_id, Attempt.number).where(
                    Attempt.reason.like("BackendError:%"), Attempt.running_since.is_(None)
                )
            ).all()
        }
    never_started = sorted(keys - set(files) - stopped_first - start_failed)
    assert set(files) <= keys and not never_started, (
        f"backend attempts without a row: {sorted(set(files) - keys)[:10]}; "
        f"rows the backend never started: {never_started[:10]}: "
        + "; ".join(_story(engine, key) for key in never_started[:3])
    )
    starts = env.starts()
    created = Counter(s["key"] for s in starts if s["fresh"])
    twice = {k: n for k, n in created.items() if n > 1}
    assert not twice, f"attempts the backend created more than once: {twice}"
    by_job: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for key, state in files.items():
        by_job[key.split("-")[0]].append((*_fake_interval(state), key))
    for job_id, intervals in by_job.items():
        intervals.sort()
        for (_, end, key), (start, _, later) in itertools.pairwise(intervals):
            assert start >= end - 1e-6, f"job {job_id}: attempt {later} started at {start} before {key} ended at {end}"

    shares = cli_json(env.url, "shares")["shares"]
    used = {(s["share"], t): v["used"] for s in shares for t, v in s["types"].items() if v["used"]}
    assert not used, f"capacity still in use after the end: {used}"
    return {
        "attempts": len(attempts),
        "starts": len(starts),
        "repeated_starts": len(starts) - len(created),
        "stopped_before_start": len(stopped_first),
        "start_failed": len(start_failed),
    }


# -- workloads ------------------------------------------------------------------------------


def mixed_workload(rng: random.Random, prefix: str, n: int) -> list[tuple[JobRequest, float]]:
    """Jobs that borrow, reclaim and preempt: the first third are low-priority research jobs
    (research borrows what prod lends) that run 6 to 10 s, long enough to be still running when
    prod, critical and higher-priority research jobs arrive (reclaim, in-share preemption) even
    if a scheduler takes seconds to start; those run 0.3 to 3 s."""
    jobs = []
    for i in range(n):
        if i < n // 3:
            share, priority, duration = "research", 1, rng.uniform(6.0, 10.0)
        else:
            share, priority = rng.choice(["research", "prod", "prod", "critical"]), rng.randint(2, 6)
            duration = rng.uniform(0.3, 3.0)
        preferences = rng.choice(PREFERENCES)
        jobs.append((request(f"{prefix}-{i}", share, *preferences, priority=priority), round(duration, 2)))
    return jobs


def submit_over_time(url: str, jobs: list[tuple[JobRequest, float]], rng: random.Random, pause: float) -> None:
    """Submit ``jobs`` in order with random pauses (mean ``pause``), through a store of its own."""
    engine = make_engine(normalize(url), pool_size=1)
    store = QuotaStore(engine)
    for job, duration in jobs:
        store.submit(job, "fake", {"duration": duration})
        time.sleep(rng.expovariate(1 / pause))
    engine.dispose()
