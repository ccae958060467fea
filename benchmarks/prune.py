"""Benchmark of retention (issue 39): how long a prune batch holds, and how fast it goes.

    python benchmarks/prune.py                  # 10,000 and 100,000 finished jobs
    python benchmarks/prune.py --jobs 20000     # other sizes

Each size runs on a fresh PostgreSQL database created on the server named by
``QUOTA_TEST_POSTGRES_URL`` (an admin URL; default ``postgresql://postgres@127.0.0.1:5432/test``),
dropped afterwards. It holds N finished jobs that ended 91 to 200 days ago (one attempt each,
three decisions, a request taken in; every fifth preempted once, every tenth with a delivered
alert), 1,000 live jobs (running, with their open attempts), five inputs a job with two
snapshots covering the older half, and a configuration of four shares. Then it prunes at
retention 90 days as the leader does, batch after batch (``Retention.batches``, each its own
transaction), and reports per kind of batch (compact, jobs, inputs, orphans) the longest
transaction (the hold on the leader's step: fence aside, what ``when_idle`` adds to an idle
step) and the median, and rows removed per second overall; the last batch, which finds nothing
(what an idle leader's check every minute costs), is reported as ``idle``. The target: the
longest ≤ 50 ms.

On a shared machine a batch's time includes waiting for a CPU. When the database server runs on
this machine (its backend's ``/proc/<pid>/schedstat`` is readable), each batch's run-queue wait,
the benchmark's thread's and the PostgreSQL backend's, is measured too and the hold without it
is shown beside the hold: what a machine with a CPU free for the leader gives.
"""

from __future__ import annotations

import argparse
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

import psycopg
from sqlalchemy import Engine, insert, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_quota.store.engine import make_engine, migrate, session_factory
from airflow_quota.store.models import (
    AlertRow,
    Attempt,
    EventRow,
    Input,
    JobRow,
    Preemption,
    Request,
    Snapshot,
)
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.retention import DAY, Removed, Retention
from airflow_quota.store.settings import normalize

ADMIN = os.environ.get("QUOTA_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
G5 = "ml.g5.xlarge"
SHARES = ["research", "prod", "vision", "speech"]
QUOTA = {
    "pool": {"capacity": {G5: 4000}},
    "shares": [{"name": name, "capacity_limits": {G5: 1000}, "strategy": "LEND_AND_BORROW"} for name in SHARES],
}
LIVE_JOBS = 1000
CHUNK = 20000


@contextmanager
def fresh_database() -> Iterator[str]:
    name = f"quota_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield normalize(f"{ADMIN.rsplit('/', 1)[0]}/{name}")
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fill(engine: Engine, jobs: int, now: float) -> None:
    """The finished and live jobs, their rows, the inputs and two snapshots (see the docstring)."""
    QuotaStore(engine, lambda: now - 300 * DAY).apply_config(QUOTA)
    span = 109 * DAY
    rows: dict[Any, list[dict[str, Any]]] = {m: [] for m in (JobRow, Attempt, EventRow, Request, Preemption, AlertRow)}

    def flush() -> None:
        with engine.begin() as connection:
            for model, batch in rows.items():
                if batch:
                    connection.execute(insert(model), batch)
                    batch.clear()

    for number in range(1, jobs + LIVE_JOBS + 1):
        live = number > jobs
        ended = now - 91 * DAY - (number % 1000) / 1000 * span - number * 1e-3 if not live else now - 3600
        placed = ended - 7200
        share = SHARES[number % len(SHARES)]
        rows[JobRow].append(
            {
                "id": number,
                "name": f"job-{number}",
                "share": share,
                "priority": 1,
                "backend": "fake",
                "request": {"preferences": [{"instance_type": G5, "count": 1}]},
                "training": {"duration": 7200},
                "submitted_at": placed - 60,
                "state": "RUNNING" if live else "SUCCEEDED",
                "attempts": 1,
                "gpu_hours": 2.0,
                "cost": 2.0,
                "updated_at": ended,
            }
        )
        rows[Attempt].append(
            {
                "job_id": number,
                "number": 1,
                "backend": "fake",
                "instance_type": G5,
                "count": 1,
                "placed_at": placed,
                "status": "RUNNING" if live else "SUCCEEDED",
                "running_since": placed,
                "ended_at": None if live else ended,
            }
        )
        for kind, at in (("SUBMITTED", placed - 60), ("PLACED", placed), ("SUCCEEDED", ended)):
            if not (live and kind == "SUCCEEDED"):
                record = {"type": kind}
                line = f"{kind} job-{number}"
                rows[EventRow].append(
                    {
                        "at": at,
                        "type": kind,
                        "job": f"job-{number}",
                        "job_id": number,
                        "share": share,
                        "record": record,
                        "line": line,
                    }
                )
        rows[Request].append(
            {"created_at": placed - 60, "kind": "submit", "job_id": number, "payload": {}, "handled": True}
        )
        if number % 5 == 0:
            rows[Preemption].append(
                {
                    "job_id": number,
                    "attempt": 1,
                    "at": placed + 60,
                    "kind": "CROSS_SHARE",
                    "by_job": "x",
                    "lost_seconds": 60.0,
                }
            )
        if number % 10 == 0:
            rows[AlertRow].append(
                {
                    "at": placed,
                    "job_id": number,
                    "job": f"job-{number}",
                    "share": share,
                    "kind": "STARVING",
                    "reason": "waited",
                    "notified": True,
                    "notified_at": placed + 1,
                }
            )
        if number % CHUNK == 0:
            flush()
    flush()
    inputs = 5 * (jobs + LIVE_JOBS)
    with engine.begin() as connection:
        for start in range(1, inputs + 1, CHUNK):
            batch = [
                {"id": i, "at": now - 200 * DAY + i / inputs * 199 * DAY, "kind": "cycle", "payload": {"n": i}}
                for i in range(start, min(start + CHUNK, inputs + 1))
            ]
            connection.execute(insert(Input), batch)
        for number, covered in ((1, inputs // 4), (2, inputs // 2)):
            connection.execute(
                insert(Snapshot),
                [
                    {
                        "id": number,
                        "last_input_id": covered,
                        "taken_at": now,
                        "format": 1,
                        "checksum": "0" * 64,
                        "size": 1,
                        "jobs": 0,
                        "payload": b"x" * 1000,
                    }
                ],
            )
        connection.execute(text("ANALYZE"))


class RunQueue:
    """Nanoseconds the benchmark's thread and a PostgreSQL backend have waited for a CPU
    (``/proc/<pid>/schedstat``'s second field); None when the backend's is not readable (a
    server elsewhere)."""

    def __init__(self, backend_pid: int) -> None:
        self.paths = [
            Path(f"/proc/self/task/{threading.get_native_id()}/schedstat"),
            Path(f"/proc/{backend_pid}/schedstat"),
        ]

    def waited(self) -> int | None:
        try:
            return sum(int(path.read_text().split()[1]) for path in self.paths)
        except (OSError, IndexError, ValueError):
            return None


def run(jobs: int) -> dict[str, Any]:
    now = time.time()
    with fresh_database() as url:
        engine = make_engine(url, pool_size=1, max_overflow=0)  # one connection: one backend to watch
        migrate(engine)
        started = time.perf_counter()
        fill(engine, jobs, now)
        filled = time.perf_counter() - started
        retention = Retention(90)
        sessions = session_factory(engine)
        with sessions() as session:
            planned = retention.plan(session, now).removed
            backend = session.scalar(text("SELECT pg_backend_pid()"))
        queue = RunQueue(int(backend))
        holds: dict[str, list[float]] = {}
        unqueued: dict[str, list[float]] = {}
        removed = Removed()
        started = time.perf_counter()
        while True:
            waited, began = queue.waited(), time.perf_counter()
            with sessions() as session, session.begin():
                batch = retention.batch(session, now)
            held, waited_after = time.perf_counter() - began, queue.waited()
            kind = "idle" if batch.kind == "none" else batch.kind
            holds.setdefault(kind, []).append(held)
            if waited is not None and waited_after is not None:
                unqueued.setdefault(kind, []).append(held - (waited_after - waited) / 1e9)
            if batch.kind == "none":
                break
            removed.add(batch.removed)
        elapsed = time.perf_counter() - started
        engine.dispose()
    assert removed == planned, (removed, planned)
    return {
        "jobs": jobs,
        "filled": filled,
        "elapsed": elapsed,
        "removed": removed,
        "holds": holds,
        "unqueued": unqueued,
        "limits": retention.limits,
    }


def spread(seconds: list[float]) -> str:
    """The longest and the median, in milliseconds."""
    return f"longest {max(seconds) * 1000:6.1f} ms, median {statistics.median(seconds) * 1000:5.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, action="append", help="finished jobs (repeat; default 10,000 and 100,000)")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    for jobs in args.jobs or [10_000, 100_000]:
        result = run(jobs)
        removed: Removed = result["removed"]
        print(f"\n{jobs:,} finished jobs + {LIVE_JOBS:,} live (filled in {result['filled']:.0f} s), {result['limits']}")
        print(f"  removed {removed.rows():,} rows ({removed.words()}), compacted {removed.hours_compacted:,} hours")
        print(f"  in {result['elapsed']:.1f} s: {removed.rows() / result['elapsed']:,.0f} rows/s")
        unqueued: dict[str, list[float]] = result["unqueued"]
        for kind, holds in result["holds"].items():
            line = f"  {kind:>8}: {len(holds):5,} batches, {spread(holds)}"
            if kind in unqueued:
                line += f"; without the run-queue wait: {spread(unqueued[kind])}"
            print(line)
        longest = max(max(h) for h in result["holds"].values())
        print(f"  longest batch of all: {longest * 1000:.1f} ms (target ≤ 50 ms)", end="")
        if unqueued:
            print(f"; without the run-queue wait: {max(max(h) for h in unqueued.values()) * 1000:.1f} ms")
        print(f"  load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
