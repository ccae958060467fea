"""Benchmark of the quota service through PostgreSQL (issue 3).

    python benchmarks/service.py            # the full sizes (about two minutes)
    python benchmarks/service.py --quick    # smaller sizes
    python benchmarks/service.py --latency-only

Each part runs on a fresh database created on the server named by ``QUOTA_TEST_POSTGRES_URL``
(an admin URL; default ``postgresql://postgres@127.0.0.1:5432/test``), dropped afterwards.

1. Submissions per second: ``QuotaStore.submit`` from 4 processes at once (each its own engine).
2. Placements per second: a ``QuotaService`` (manual clock, in-memory fake backend) stepping over a
   queue of RUNNABLE jobs in a pool big enough for all of them: intake, cycles, commits, and the
   backend starts with their per-attempt transactions.
3. Cycle time with 10k RUNNABLE jobs in the database (a full pool, so none can be placed): the
   intake of the burst (its longest step bounds how long a new leader needs before its first
   commit), one step with a cycle and nothing new (the steady state), a step after one submission, and the
   recovery of a new leader (replaying the input log).
4. Placement latency: ``QuotaService.run`` on the wall clock with a pool of one instance and a
   queue of short fake jobs; for each job placed after a finish, placed_at minus the moment the
   previous attempt ended in the backend (p50, p95). ``--poll-seconds`` is the scheduler's poll
   interval (the CLI's default is 0.2 s).

Targets (issue 3): ≥ 500 submits/s, ≥ 200 placements/s, p95 latency ≤ 1 s.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from sqlalchemy import Engine, func, select

from airflow_quota.core.model import JobRequest, PreferenceEntry
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock, WallClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.backend_names import TEST_BACKENDS_VARIABLE
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import Attempt, JobRow
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize

ADMIN = os.environ.get("QUOTA_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
os.environ[TEST_BACKENDS_VARIABLE] = "fake"  # the benchmark's jobs run on the fake backend
SHARES = ["a", "b", "c", "d"]
TYPES = ["ml.g5.xlarge", "ml.g5.2xlarge"]


def config(capacity: int) -> dict[str, Any]:
    """4 LEND_AND_BORROW shares with a quarter of ``capacity`` of each of 2 types."""
    limit = capacity // 4
    return {
        "pool": {"capacity": dict.fromkeys(TYPES, capacity)},
        "shares": [
            {"name": s, "capacity_limits": dict.fromkeys(TYPES, limit), "strategy": "LEND_AND_BORROW"} for s in SHARES
        ],
    }


def request(i: int, prefix: str = "j") -> JobRequest:
    share = SHARES[i % len(SHARES)]
    return JobRequest(
        name=f"{prefix}{i}",
        share=share,
        priority=i % 7,
        preferences=[PreferenceEntry(instance_type=TYPES[i % 2], count=1)],
    )


@contextmanager
def fresh_database() -> Iterator[str]:
    name = f"quota_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield normalize(f"{ADMIN.rsplit('/', 1)[0]}/{name}")
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def prepared(url: str, capacity: int) -> tuple[Engine, QuotaStore]:
    engine = make_engine(url)
    migrate(engine)
    store = QuotaStore(engine)
    store.apply_config(config(capacity))
    return engine, store


def _submit_range(url: str, start: int, count: int, prefix: str, ready: Any, go: Any) -> None:
    engine = make_engine(url, pool_size=1)
    store = QuotaStore(engine)
    store.latest_config()  # connect before the clock starts
    ready.release()
    go.wait()
    for i in range(start, start + count):
        store.submit(request(i, prefix), "fake", {"duration": 3600})
    engine.dispose()


def submit_parallel(url: str, total: int, processes: int = 4, prefix: str = "j") -> float:
    """Submit ``total`` jobs from ``processes`` processes; returns the seconds it took."""
    context = multiprocessing.get_context("spawn")
    ready, go = context.Semaphore(0), context.Event()
    per = total // processes
    workers = [
        context.Process(target=_submit_range, args=(url, k * per, per, prefix, ready, go)) for k in range(processes)
    ]
    for w in workers:
        w.start()
    for _ in workers:
        ready.acquire()
    start = time.perf_counter()
    go.set()
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise SystemExit(f"a submitting process failed with exit code {w.exitcode}")
    return time.perf_counter() - start


def bench_submissions(total: int) -> dict[str, float]:
    with fresh_database() as url:
        engine, _ = prepared(url, 1000)
        seconds = submit_parallel(url, total)
        with engine.connect() as c:
            stored = c.scalar(select(func.count()).select_from(JobRow))
        engine.dispose()
    assert stored == total, (stored, total)
    return {"jobs": total, "seconds": seconds, "per_second": total / seconds}


def bench_placements(total: int) -> dict[str, float]:
    with fresh_database() as url:
        engine, _ = prepared(url, total)  # room for every job
        submit_parallel(url, total)
        clock = ManualClock(time.time())
        service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock)
        service.recover()
        start = time.perf_counter()
        steps = 0
        while True:
            steps += 1
            service.step()
            with engine.connect() as c:
                placed = c.scalar(select(func.count()).select_from(Attempt).where(Attempt.action.is_(None)))
            if placed == total or steps > 1000:
                break
            clock.advance_to(clock.time + 0.01)
        seconds = time.perf_counter() - start
        engine.dispose()
    assert placed == total, (placed, total)
    return {"jobs": total, "seconds": seconds, "per_second": total / seconds, "steps": steps}


def bench_cycle(runnable: int, repeats: int = 20) -> dict[str, float]:
    with fresh_database() as url:
        engine, store = prepared(url, 4)  # 8 instances: nearly every job waits
        submit_parallel(url, runnable)
        clock = ManualClock(time.time())
        service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock, cycle_seconds=0.0)
        service.recover()
        start = time.perf_counter()
        intake_steps = 0
        longest_step = 0.0
        while store.pending_requests():  # a step takes in at most REQUESTS_PER_STEP requests
            began = time.perf_counter()
            service.step()
            longest_step = max(longest_step, time.perf_counter() - began)
            intake_steps += 1
        intake = time.perf_counter() - start
        with engine.connect() as c:
            waiting = c.scalar(select(func.count()).select_from(JobRow).where(JobRow.state == "RUNNABLE"))
        steady = []
        for _ in range(repeats):
            clock.advance_to(clock.time + 1.0)
            start = time.perf_counter()
            service.step()
            steady.append(time.perf_counter() - start)
        after_submit = []
        for k in range(5):
            store.submit(request(10**6 + k, "extra"), "fake", {"duration": 3600})
            clock.advance_to(clock.time + 1.0)
            start = time.perf_counter()
            service.step()
            after_submit.append(time.perf_counter() - start)
        start = time.perf_counter()
        QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock).recover()
        recovery = time.perf_counter() - start
        engine.dispose()
    return {
        "runnable": float(waiting or 0),
        "intake": intake,
        "intake_steps": float(intake_steps),
        "longest_intake_step": longest_step,
        "steady_p50": statistics.median(steady),
        "steady_max": max(steady),
        "after_submit_p50": statistics.median(after_submit),
        "recovery": recovery,
    }


def bench_latency(jobs: int, poll_seconds: float) -> dict[str, float]:
    """One instance, ``jobs`` short jobs queued behind each other in one share."""
    single = {
        "pool": {"capacity": {"ml.g5.xlarge": 1}},
        "shares": [{"name": "a", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "LEND_AND_BORROW"}],
    }
    with fresh_database() as url:
        engine = make_engine(url)
        migrate(engine)
        store = QuotaStore(engine)
        store.apply_config(single)
        for i in range(jobs):
            job = JobRequest(
                name=f"l{i}", share="a", preferences=[PreferenceEntry(instance_type="ml.g5.xlarge", count=1)]
            )
            store.submit(job, "fake", {"duration": 0.15})
        clock = WallClock()
        backend = FakeBackend(clock.now)
        service = QuotaService(engine, {"fake": backend}, clock=clock, poll_seconds=poll_seconds)
        stop = threading.Event()
        thread = threading.Thread(target=service.run, args=(stop,))
        thread.start()
        deadline = time.monotonic() + 60 + jobs
        while time.monotonic() < deadline:
            with engine.connect() as c:
                final = c.scalar(select(func.count()).select_from(JobRow).where(JobRow.state == "SUCCEEDED"))
            if final == jobs:
                break
            time.sleep(0.1)
        stop.set()
        thread.join()
        with engine.connect() as c:
            placements = c.execute(select(Attempt.job_id, Attempt.number, Attempt.placed_at)).all()
            # when each attempt ended in the backend, as the backend reported it
            ends = sorted(end for end in c.scalars(select(Attempt.ended_at)) if end is not None)
        engine.dispose()
    latencies = []
    for _, _, placed_at in placements:
        before = [end for end in ends if end <= placed_at]
        if before:
            latencies.append(placed_at - before[-1])
    latencies.sort()
    return {
        "placements": float(len(latencies)),
        "p50": statistics.median(latencies),
        "p95": latencies[int(0.95 * (len(latencies) - 1))],
        "max": latencies[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--poll-seconds", type=float, default=0.2, help="the scheduler's poll interval (latency)")
    parser.add_argument("--latency-only", action="store_true", help="part 4 alone")
    args = parser.parse_args()
    submits, placements, runnable, latency_jobs = (400, 400, 2000, 20) if args.quick else (4000, 2000, 10000, 60)

    flags = "".join(f" --{name.replace('_', '-')}" for name in ("quick", "latency_only") if getattr(args, name))
    print(f"$ python benchmarks/service.py{flags}  (PostgreSQL at {ADMIN.split('@')[-1]})")
    rows: list[tuple[str, str, str]] = []
    if not args.latency_only:
        s = bench_submissions(submits)
        rows.append(
            ("submissions, 4 processes", f"{s['per_second']:,.0f} /s ({submits} in {s['seconds']:.2f} s)", "≥ 500/s")
        )
        p = bench_placements(placements)
        rows.append(
            (
                "placements, one service",
                f"{p['per_second']:,.0f} /s ({placements} in {p['seconds']:.2f} s, {p['steps']:.0f} steps)",
                "≥ 200/s",
            )
        )
        c = bench_cycle(runnable)
        rows.append(
            (
                f"intake of {runnable:,} submissions",
                f"{c['intake']:.2f} s ({c['intake_steps']:.0f} steps, "
                f"longest {c['longest_intake_step'] * 1000:.0f} ms)",
                "",
            )
        )
        rows.append(
            (
                f"cycle step, {c['runnable']:,.0f} RUNNABLE",
                f"p50 {c['steady_p50'] * 1000:.0f} ms, max {c['steady_max'] * 1000:.0f} ms",
                "",
            )
        )
        rows.append(("step after one submission", f"p50 {c['after_submit_p50'] * 1000:.0f} ms", ""))
        rows.append(("recovery (replay of the log)", f"{c['recovery']:.2f} s", ""))
    lat = bench_latency(latency_jobs, args.poll_seconds)
    rows.append(
        (
            f"finish → next placement (poll {args.poll_seconds:g} s)",
            f"p50 {lat['p50'] * 1000:.0f} ms, p95 {lat['p95'] * 1000:.0f} ms, max {lat['max'] * 1000:.0f} ms",
            "p95 ≤ 1 s",
        )
    )
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"{'measure':<{width[0]}}  {'result':<{width[1]}}  target")
    for name, result, target in rows:
        print(f"{name:<{width[0]}}  {result:<{width[1]}}  {target}")


if __name__ == "__main__":
    main()
