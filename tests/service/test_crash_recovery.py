"""Crash recovery with real processes: ``airflow-quota scheduler`` subprocesses, SIGKILL at chosen
moments, a new scheduler recovering from the input log, and the books checked afterwards
(``check_books`` in ``chaos.py`` says what "nothing lost, nothing twice, nothing leaked" means).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text

from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import WallClock
from airflow_quota.store.models import Leader
from tests.builders import request
from tests.service.chaos import (
    Env,
    Scheduler,
    Watcher,
    all_final,
    check_books,
    counts,
    fake_attempts,
    mixed_workload,
    prepared,
    submit_many,
    submit_over_time,
)
from tests.waiting import wait_for

# -- the tests ------------------------------------------------------------------------------


def kill_when(scheduler: Scheduler, engine: Engine, query: str, timeout: float = 30.0) -> int:
    """SIGKILL ``scheduler`` the moment ``query`` (a count) is positive; returns that count."""
    deadline = time.monotonic() + timeout
    with engine.connect() as c:
        while time.monotonic() < deadline:
            seen = int(c.scalar(text(query)) or 0)
            c.rollback()
            if seen:
                scheduler.proc.send_signal(signal.SIGKILL)
                scheduler.kill()
                return seen
            assert scheduler.alive(), f"the scheduler exited:\n{scheduler.log()}"
    raise AssertionError(f"timed out waiting for {query!r}")


PENDING_STARTS = "SELECT count(*) FROM quota_attempts WHERE action = 'START'"
PENDING_STOPS = "SELECT count(*) FROM quota_attempts WHERE action = 'STOP'"


def test_killed_between_committing_placements_and_starting_them(
    postgres_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    """40 jobs wait before any scheduler runs; the first one places them all in one step, commits
    the placements and starts them one by one. It is SIGKILLed as soon as the committed START
    actions are visible, so some are still pending; the next scheduler starts exactly those."""
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url)
    for i in range(40):
        store.submit(request(f"batch-{i}"), "fake", {"duration": 1.5})
    watcher = Watcher(postgres_url, store.latest_config()[1]).start()  # type: ignore[index]

    first = Scheduler(env)
    schedulers.append(first)
    kill_when(first, engine, PENDING_STARTS)
    after_kill = counts(engine)
    started_by_first = {s["key"] for s in env.starts()}
    assert after_kill["pending_actions"] > 0, f"the kill came after every start was done: {after_kill}"
    assert len(fake_attempts(env)) < 10, "the first scheduler should have started at most part of its placements"

    second = Scheduler(env)
    schedulers.append(second)
    second.wait_for_log("recovered from")
    wait_for(all_final(engine, 40), 60, "all 40 jobs to end")
    watcher.stop()

    figures = check_books(env, engine, 40)
    resumed = {s["key"] for s in env.starts() if s["pid"] == second.proc.pid}
    assert resumed, "the second scheduler started nothing"
    # what the first had begun is not started again (a repeated call is a no-op, never a new attempt)
    assert not {s["key"] for s in env.starts() if s["pid"] == second.proc.pid and s["fresh"]} & started_by_first
    assert figures["attempts"] == 40, "no job needed a second attempt: nothing was preempted or lost"
    watcher.assert_held()
    engine.dispose()


def test_killed_between_committing_preemptions_and_stopping_victims(
    postgres_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    """10 low-priority research jobs fill what research may hold; 10 high-priority ones then
    preempt them all in one cycle (in-share). The scheduler is SIGKILLed as soon as the STOP
    actions are committed; the next one stops the victims, starts the preemptors, and requeues
    the victims, each of which then runs its second attempt once."""
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url)
    first = Scheduler(env)
    schedulers.append(first)
    for i in range(10):
        # they run far longer than the test (a loaded machine must not let one finish first)
        store.submit(request(f"low-{i}", priority=1), "fake", {"duration": 600})
    wait_for(lambda: counts(engine)["running_attempts"] == 10, 30, "10 low-priority jobs running")
    watcher = Watcher(postgres_url, store.latest_config()[1]).start()  # type: ignore[index]
    for i in range(10):
        # long enough that none ends before the takeover has placed them all: a preemptor that
        # ended first would give its slot to the next one, and a victim would keep running
        store.submit(request(f"high-{i}", priority=5), "fake", {"duration": 5})
    stops = kill_when(first, engine, PENDING_STOPS)
    assert stops > 0

    second = Scheduler(env)
    schedulers.append(second)
    # the victims' second attempts would run 600 s: cancel them once they are back, to end the test
    wait_for(lambda: counts(engine).get("SUCCEEDED", 0) == 10, 60, "the 10 preemptors to succeed")
    low = [store.job_by_name(f"low-{i}") for i in range(10)]
    assert all(j is not None and j.preemptions == 1 for j in low), [(j.name, j.preemptions) for j in low if j]
    for job in low:
        assert job is not None
        store.cancel(job.id)
    wait_for(all_final(engine, 20), 60, "all 20 jobs to end")
    watcher.stop()

    check_books(env, engine, 20, all_succeed=False)
    final = {j.name: (j.state, j.reason) for j in store.jobs()}
    assert all(final[f"high-{i}"] == ("SUCCEEDED", None) for i in range(10)), final
    assert all(final[f"low-{i}"] == ("FAILED", "CANCELLED") for i in range(10)), final
    stopped = [a for j in low if j for a in store.attempts(j.id) if a.number == 1]
    assert all(a.status == "STOPPED" for a in stopped), [(a.job_id, a.status) for a in stopped]
    watcher.assert_held()
    engine.dispose()


def test_finishes_while_no_scheduler_runs_are_taken_in_once(
    postgres_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    """SIGKILL while jobs run; they finish in the backend while no scheduler is up; the next
    scheduler records each finish once and places the queue behind them."""
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url)
    first = Scheduler(env)
    schedulers.append(first)
    submit_many(store, "wave", 30, 1.0, seed=4)
    wait_for(lambda: counts(engine)["running_attempts"] >= 5, 30, "jobs running")
    first.kill()
    backend = FakeBackend(WallClock().now, env.fake_dir)
    wait_for(backend.all_ended, 30, "every attempt to finish in the backend, unobserved")
    second = Scheduler(env)
    schedulers.append(second)
    wait_for(all_final(engine, 30), 90, "all 30 jobs to end")
    check_books(env, engine, 30)
    engine.dispose()


@pytest.mark.parametrize("seed", [11])
def test_repeated_sigkills_at_random_moments(
    postgres_url: str, tmp_path: Path, schedulers: list[Scheduler], seed: int
) -> None:
    """Jobs that borrow, reclaim and preempt arrive for about 8 s while the scheduler is SIGKILLed
    every 0.1 to 1.6 s of its life (seeded) and restarted at once, until every job has ended."""
    rng = random.Random(seed)
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url)
    jobs = 60
    workload = mixed_workload(rng, "mixed", jobs)
    watcher = Watcher(postgres_url, store.latest_config()[1]).start()  # type: ignore[index]
    submitter = threading.Thread(target=submit_over_time, args=(postgres_url, workload, random.Random(seed), 0.13))
    kills = 0
    done = all_final(engine, jobs)
    deadline = time.monotonic() + 120
    while submitter.is_alive() or not done():
        assert time.monotonic() < deadline, f"jobs did not all end: {counts(engine)}"
        scheduler = Scheduler(env)
        schedulers.append(scheduler)
        scheduler.wait_for_log("recovered from")
        if kills == 0 and not submitter.is_alive():
            submitter.start()  # jobs arrive while a scheduler runs, not all before the first one leads
        time.sleep(rng.uniform(0.1, 1.6))
        if not submitter.is_alive() and done():
            break
        scheduler.kill()
        kills += 1
    submitter.join()
    watcher.stop()
    figures = check_books(env, engine, jobs)
    assert kills >= 5, "the scheduler was hardly killed: raise the job count or durations"
    preempted = sum(j.preemptions for j in store.jobs())
    assert preempted > 0 and figures["attempts"] > jobs, "the mix should preempt (reclaim and in-share)"
    watcher.assert_held(at_least=50)  # arrivals alone last about 8 s: 160 samples at 0.05 s
    engine.dispose()


# -- leadership -----------------------------------------------------------------------------


def test_two_schedulers_one_leads_the_other_takes_over_after_sigkill(
    postgres_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url)
    a = Scheduler(env)
    schedulers.append(a)
    a.wait_for_log("leads the quota scheduler")
    b = Scheduler(env)
    schedulers.append(b)
    b.wait_for_log("quota scheduler ")  # it is up
    time.sleep(2.0)
    assert not b.leads(), b.log()
    with engine.connect() as c:
        assert c.scalar(select(Leader.holder)) == a.holder

    submit_many(store, "lead", 20, 1.0, seed=5)
    wait_for(lambda: counts(engine)["running_attempts"] >= 5, 30, "jobs running under the first leader")
    a.kill()
    killed_at = time.monotonic()
    wait_for(b.leads, 10, "the standby to take over")
    took = time.monotonic() - killed_at
    assert took < 5, f"the standby took {took:.1f} s to lead"
    with engine.connect() as c:
        assert c.scalar(select(Leader.holder)) == b.holder
    wait_for(all_final(engine, 20), 60, "all 20 jobs to end under the new leader")
    check_books(env, engine, 20)
    assert "SUCCEEDED" in b.log()
    assert b.terminate() == 0
    assert f"{b.holder} stopped" in b.log()
    engine.dispose()


def test_sigterm_stops_leader_and_standby_cleanly(
    postgres_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    """SIGTERM: exit code 0 and "stopped"; the lock is released so a standby leads at once."""
    env = Env(postgres_url, tmp_path)
    engine, _ = prepared(postgres_url)
    a = Scheduler(env)
    schedulers.append(a)
    a.wait_for_log("leads the quota scheduler")
    b = Scheduler(env)
    schedulers.append(b)
    b.wait_for_log("quota scheduler ")
    assert a.terminate() == 0
    assert "received SIGTERM" in a.log() and f"{a.holder} stopped" in a.log(), a.log()
    wait_for(b.leads, 5, "the standby to lead after a clean stop")
    assert b.terminate() == 0
    assert "Traceback" not in a.log() + b.log()
    engine.dispose()


def test_sqlite_lease_leader_recovers_after_sigkill(
    sqlite_url: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    """The SQLite path: the lease row makes one leader; after a SIGKILL the standby waits for
    the lease to run out (``--lease-seconds 2``), recovers and finishes the work."""
    env = Env(sqlite_url, tmp_path)
    engine, store = prepared(sqlite_url)
    a = Scheduler(env, "--lease-seconds", "2")
    schedulers.append(a)
    a.wait_for_log("leads the quota scheduler")
    b = Scheduler(env, "--lease-seconds", "2")
    schedulers.append(b)
    b.wait_for_log("quota scheduler ")
    submit_many(store, "lite", 15, 1.0, seed=6)
    wait_for(lambda: counts(engine)["running_attempts"] >= 3, 30, "jobs running")
    assert not b.leads()
    a.kill()
    wait_for(b.leads, 10, "the standby to take the lease")
    wait_for(all_final(engine, 15), 60, "all 15 jobs to end")
    check_books(env, engine, 15)
    with engine.connect() as c:
        assert c.scalar(select(Leader.holder)) == b.holder
    assert b.terminate() == 0 and f"{b.holder} stopped" in b.log()
    engine.dispose()
