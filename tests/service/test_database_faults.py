"""The quota service survives the database and a stuck leader (issue 14, findings 7, 8 and 10),
with real ``airflow-quota scheduler`` processes on a real PostgreSQL:

- every connection of the schedulers terminated (``pg_terminate_backend``, what a failover does)
  under load: leader and standby live on, decisions resume within 5 s;
- the PostgreSQL server itself restarted (one this test starts): the same;
- the leader frozen (SIGSTOP) for three lease periods, then resumed: the standby leads within
  ``--lease-seconds`` + 2 s, and the old leader commits nothing afterwards (every decision
  row records the lease epoch it was committed under);
- a seeded chaos run: two schedulers, 200 jobs, SIGKILLs and dropped connections: every job ends
  exactly once and the invariant holds in every sample.

The helpers (``Env``, ``Scheduler``, ``Watcher``, ``check_books``...) are ``chaos.py``'s.
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, func, select

from airflow_quota.store.engine import make_engine
from airflow_quota.store.models import EventRow, Leader
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize
from tests.postgres import Server
from tests.service.chaos import Env, Scheduler, Watcher, all_final, check_books, counts, prepared, random_request
from tests.waiting import wait_for

SUBMITTER = "quota-test-submitter"
"""The application_name of the tests' submitting connection, which faults leave alone."""


# -- helpers --------------------------------------------------------------------------------


def last_event(engine: Engine) -> int:
    """The id of the newest committed decision row (0 when none)."""
    with engine.connect() as c:
        return int(c.scalar(select(func.max(EventRow.id))) or 0)


def terminate_connections(url: str) -> int:
    """``pg_terminate_backend`` every connection to the test's database but this one and the
    submitter's: the schedulers' (leader's and standby's), the watcher's, the test's pool."""
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True, application_name=SUBMITTER) as c:
        rows = c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND application_name <> %s",
            (database, SUBMITTER),
        ).fetchall()
    return len(rows)


def submit_jobs(
    url: str, n: int, seed: int, pause: float = 0.0, prefix: str = "job", seconds: tuple[float, float] = (0.2, 1.2)
) -> None:
    """``n`` short fake jobs (``seconds`` long, random shares, types and priorities: they borrow,
    reclaim and preempt), through a connection the faults leave alone."""
    rng = random.Random(seed)
    engine = make_engine(normalize(url), pool_size=1, connect_args={"application_name": SUBMITTER})
    store = QuotaStore(engine)
    for i in range(n):
        job = random_request(rng, f"{prefix}-{i}")
        store.submit(job, "fake", {"duration": round(rng.uniform(*seconds), 2)})
        if pause:
            time.sleep(rng.expovariate(1 / pause))
    engine.dispose()


def epochs(scheduler: Scheduler) -> list[int]:
    """The lease epochs ``scheduler`` led under, from its log."""
    return [int(e) for e in re.findall(r"leads the quota scheduler \(lease epoch (\d+)", scheduler.log())]


def busy(engine: Engine) -> bool:
    """Work is waiting and running: decisions are due all the time."""
    now = counts(engine)
    return now.get("RUNNABLE", 0) >= 5 and now["running_attempts"] >= 3


def pair(env: Env, schedulers: list[Scheduler], *extra: str) -> tuple[Scheduler, Scheduler]:
    """Two schedulers started together; (the one that leads, the standby) once both are up."""
    both = [Scheduler(env, *extra), Scheduler(env, *extra)]
    schedulers.extend(both)
    wait_for(lambda: any(s.leads() for s in both), 30, "a leader")
    leader = next(s for s in both if s.leads())
    standby = both[1] if leader is both[0] else both[0]
    standby.wait_for_log("quota scheduler ")
    return leader, standby


def assert_survived(*alive: Scheduler) -> None:
    for scheduler in alive:
        assert scheduler.alive(), f"scheduler exited ({scheduler.proc.returncode}):\n{scheduler.log()[-3000:]}"
        assert "Traceback" not in scheduler.log(), scheduler.log()[-3000:]


# -- connections terminated -----------------------------------------------------------------


def test_connections_terminated_under_load(postgres_url: str, tmp_path: Path, schedulers: list[Scheduler]) -> None:
    """Three times, every connection of both schedulers is terminated while jobs wait and run;
    both live on, log the error in one line, and decisions resume within 5 s each time."""
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url)
    a, b = pair(env, schedulers)
    watcher = Watcher(postgres_url, store.latest_config()[1]).start()  # type: ignore[index]
    submit_jobs(postgres_url, 70, seed=21)
    resumed = []
    for _ in range(3):
        wait_for(lambda: busy(engine), 30, "jobs waiting and running")
        assert terminate_connections(postgres_url) >= 2, "the schedulers' connections were not found"
        dropped = last_event(engine)
        at = time.monotonic()
        wait_for(lambda: last_event(engine) > dropped, 5, "a decision committed after the connections dropped")  # noqa: B023
        resumed.append(time.monotonic() - at)
        assert_survived(a, b)
    wait_for(all_final(engine, 70), 90, "all 70 jobs to end")
    watcher.stop()
    check_books(env, engine, 70)
    assert_survived(a, b)
    logged = a.log() + b.log()
    line = next(x for x in logged.splitlines() if "database error" in x)
    assert "retrying in" in line and "Traceback" not in logged, line
    watcher.assert_held()
    assert max(resumed) < 5, resumed
    engine.dispose()


# -- the server restarted -------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[Server]:
    made = Server()
    made.start()
    yield made
    made.remove()


def test_the_server_restarted(server: Server, tmp_path: Path, schedulers: list[Scheduler]) -> None:
    """The server is stopped (fast shutdown: every session ends) for 2 s and started again;
    leader and standby retry with back-off, and decisions resume within 5 s of it answering."""
    env = Env(server.url, tmp_path)
    engine, store = prepared(server.url)
    a, b = pair(env, schedulers)
    watcher = Watcher(server.url, store.latest_config()[1]).start()  # type: ignore[index]
    submit_jobs(server.url, 50, seed=22)
    wait_for(lambda: busy(engine), 30, "jobs waiting and running")
    before = last_event(engine)
    server.stop()
    wait_for(lambda: "database error" in a.log() and "database error" in b.log(), 10, "both to see the outage")
    time.sleep(2.0)  # the outage: a fixed length, as a real restart has
    assert_survived(a, b)
    server.start()
    wait_for(server.answers, 10, "the server to answer")
    back = time.monotonic()
    wait_for(lambda: last_event(engine) > before, 5, "a decision after the restart")
    took = time.monotonic() - back
    wait_for(all_final(engine, 50), 90, "all 50 jobs to end")
    watcher.stop()
    check_books(env, engine, 50)
    assert_survived(a, b)
    watcher.assert_held()
    retries = re.findall(r"retrying in ([\d.]+) s", a.log() + b.log())
    assert retries and max(float(r) for r in retries) <= 5.0, retries
    assert took < 5, f"decisions resumed {took:.1f} s after the server answered"
    engine.dispose()


# -- a frozen leader ------------------------------------------------------------------------


LEASE = 2.0


def test_a_frozen_leader_is_replaced_and_commits_nothing_after(
    postgres_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    """The leader is SIGSTOPped (its connections stay open) for 3 leases: the standby takes
    over within lease + 2 s; resumed, the old leader steps down and commits no decision."""
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url)
    a, b = pair(env, schedulers, "--lease-seconds", str(LEASE))
    watcher = Watcher(postgres_url, store.latest_config()[1]).start()  # type: ignore[index]
    submit_jobs(postgres_url, 50, seed=23)
    wait_for(lambda: busy(engine), 30, "jobs waiting and running")
    (old_epoch,) = epochs(a)

    a.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(b.leads, LEASE + 2, "the standby to take over the frozen leader")
        took = time.monotonic() - stopped
        time.sleep(max(0.0, 3 * LEASE - (time.monotonic() - stopped)))  # frozen for 3 leases in all
        with engine.connect() as c:
            by_old = int(
                c.scalar(select(func.count()).select_from(EventRow).where(EventRow.leader_epoch == old_epoch)) or 0
            )
    finally:
        a.proc.send_signal(signal.SIGCONT)
    wait_for(
        lambda: "lost the leadership" in a.log() or "database error" in a.log(),
        10,
        "the resumed leader to notice it lost the lease",
    )
    wait_for(all_final(engine, 50), 90, "all 50 jobs to end")
    watcher.stop()
    check_books(env, engine, 50)
    assert_survived(a, b)
    (new_epoch,) = epochs(b)
    assert new_epoch > old_epoch
    with engine.connect() as c:
        after = int(c.scalar(select(func.count()).select_from(EventRow).where(EventRow.leader_epoch == old_epoch)) or 0)
        by_new = c.scalar(select(func.count()).select_from(EventRow).where(EventRow.leader_epoch == new_epoch))
        unfenced = c.scalar(select(func.count()).select_from(EventRow).where(EventRow.leader_epoch.is_(None)))
        holder = c.scalar(select(Leader.holder))
    assert after == by_old, f"the old leader committed {after - by_old} decisions after it lost the lease"
    assert by_new and not unfenced
    assert holder == b.holder
    assert len(epochs(a)) == 1, "the old leader must not take the lease back while the new one beats"
    assert took <= LEASE + 2, f"the standby took {took:.1f} s to lead"
    watcher.assert_held(at_least=50)  # the leader was frozen for 3 leases, 6 s: 120 samples at 0.05 s
    engine.dispose()


# -- chaos ----------------------------------------------------------------------------------


def _ready(scheduler: Scheduler) -> bool:
    """Up and in the election: leading, or waiting as a standby."""
    return scheduler.alive() and ("waits as standby" in scheduler.log() or scheduler.leads())


@pytest.mark.parametrize("seed", [7])
def test_chaos_kills_and_dropped_connections(
    postgres_url: str, tmp_path: Path, schedulers: list[Scheduler], seed: int
) -> None:
    """A leader and two standbys, 200 jobs arriving over about 4 s, and five faults at seeded
    moments: the leader SIGKILLed (a replacement is started at once, and boots while the next
    standby leads) or every connection dropped. Every job ends exactly once, nothing starts
    twice, and the invariant holds in every sample."""
    rng = random.Random(seed)
    jobs = 200
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url)
    running = [Scheduler(env) for _ in range(3)]
    schedulers.extend(running)
    wait_for(lambda: all(_ready(s) for s in running), 60, "a leader and two standbys")
    watcher = Watcher(postgres_url, store.latest_config()[1]).start()  # type: ignore[index]
    submitter = threading.Thread(target=submit_jobs, args=(postgres_url, jobs, seed, 0.02, "chaos", (0.1, 0.6)))
    submitter.start()
    faults = []
    for _ in range(5):
        time.sleep(rng.uniform(0.5, 1.5))  # the seeded moment of the next fault
        kill = rng.random() < 0.5
        with engine.connect() as c:
            holder = c.scalar(select(Leader.holder))
        leader = next((s for s in running if s.holder == holder and s.alive()), None)
        standbys = [s for s in running if s is not leader and _ready(s)]
        if kill and leader is not None and standbys:
            leader.kill()
            running.remove(leader)
            replacement = Scheduler(env)
            schedulers.append(replacement)
            running.append(replacement)
            faults.append("kill")
        else:
            terminate_connections(postgres_url)
            faults.append("drop")
    submitter.join()
    wait_for(all_final(engine, jobs), 120, f"all {jobs} jobs to end")
    watcher.stop()
    figures = check_books(env, engine, jobs, all_succeed=True)
    assert_survived(*running)
    assert "kill" in faults and "drop" in faults, faults
    assert figures["attempts"] >= jobs
    watcher.assert_held(at_least=50)
    engine.dispose()
