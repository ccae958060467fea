"""Benchmark of retention (issue 39): how long a prune batch holds, and how fast it goes.

    python benchmarks/prune.py                       # 10,000 and 100,000 finished jobs
    python benchmarks/prune.py --jobs 1000 --jobs 20000  # other sizes
    python benchmarks/prune.py --fixed-limits        # batches of the limits always (no time budget)
    python benchmarks/prune.py --db postgresql://postgres@127.0.0.1:5432/test  # a server of yours

Each size runs on a fresh database of a PostgreSQL server the benchmark starts itself
(``throwaway_postgres.py``: autovacuum at the server's default, on), or of the server ``--db``
names (an admin URL), dropped afterwards. It holds N finished jobs that ended 91 to 200 days ago
(one attempt each, three decisions, a request taken in; every fifth preempted once, every tenth
with a delivered alert), 1,000 live jobs (running, with their open attempts), five inputs a job
with two snapshots covering the older half, and a configuration of four shares, then ``VACUUM
ANALYZE`` (what autovacuum has done long before a prune on a production database: the history
is weeks old). Then it prunes at retention 90 days as the leader does, batch after batch, each
its own transaction whose hold sizes the next batch (``Retention.held``), and reports per kind
of batch (compact, jobs, inputs, orphans) the longest transaction (the hold on the leader's
step: fence aside, what ``when_idle`` adds to an idle step) and the median, the smallest share
of the limits the batches shrank to, and rows removed per second overall; the last batch, which
finds nothing (what an idle leader's check every minute costs), is reported as ``idle``, and one
more idle check after it as "the next idle check". The target: the longest ≤ 50 ms.

On a shared machine a batch's time includes waiting for a CPU, and in any Python process it
includes the garbage collector's pauses, which a batch's allocations trigger but whose length is
the whole process's heap's (a full collection walks every object). When the database server runs
on this machine (its backend's ``/proc/<pid>/schedstat`` is readable), each batch's run-queue
wait, the benchmark's thread's and the PostgreSQL backend's, and the collector's CPU time in it
(``gc.callbacks``) are measured too, and the hold without them is shown beside the hold ("net of
CPU waits and GC"): what the batch's own statements and commit take. Before the batches the
benchmark freezes its heap as the scheduler process does after recovery (``freeze_long_lived``),
so a full collection walks only what the batches made.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_quota.sim.gc_tuning import freeze_long_lived
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
from airflow_quota.store.retention import DAY, BatchSize, Removed, Retention
from airflow_quota.store.settings import normalize
from benchmarks.throwaway_postgres import ThrowawayPostgres, fresh_database

G5 = "ml.g5.xlarge"
SHARES = ["research", "prod", "vision", "speech"]
QUOTA = {
    "pool": {"capacity": {G5: 4000}},
    "shares": [{"name": name, "capacity_limits": {G5: 1000}, "strategy": "LEND_AND_BORROW"} for name in SHARES],
}
LIVE_JOBS = 1000
CHUNK = 20000


@contextmanager
def server(admin: str | None) -> Iterator[str]:
    """The admin URL of the server to benchmark on: ``admin``, or a throwaway one's."""
    with nullcontext(admin) if admin else ThrowawayPostgres() as started:
        yield started if isinstance(started, str) else started.url


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
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE"))  # as autovacuum would have, weeks ago


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


class Collections:
    """CPU seconds this thread has spent in the garbage collector, and the full (generation 2)
    collections with the longest, while watching (a ``gc.callbacks`` entry)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.longest_full = 0.0
        self._began = 0.0

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exception: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.thread_time()
            return
        spent = time.thread_time() - self._began
        self.seconds += spent
        if info["generation"] == 2:
            self.full += 1
            self.longest_full = max(self.longest_full, spent)


def run(admin: str, jobs: int, fixed_limits: bool) -> dict[str, Any]:
    now = time.time()
    with fresh_database(admin, prefix="quota_bench") as url:
        engine = make_engine(normalize(url), pool_size=1, max_overflow=0)  # one connection: one backend to watch
        migrate(engine)
        started = time.perf_counter()
        fill(engine, jobs, now)
        filled = time.perf_counter() - started
        retention = Retention(90, size=BatchSize(budget=math.inf) if fixed_limits else BatchSize())
        sessions = session_factory(engine)
        with sessions() as session:
            planned = retention.plan(session, now).removed
            backend = session.scalar(text("SELECT pg_backend_pid()"))
            autovacuum = session.scalar(text("SHOW autovacuum"))
        freeze_long_lived()  # as the scheduler process does after recovery: its heap is not walked again
        smallest_share = 1.0
        slowest: list[tuple[float, int, str, float]] = []
        """Every batch's (hold, number, kind, share of the limits it took): the slowest are shown."""
        queue = RunQueue(int(backend))
        holds: dict[str, list[float]] = {}
        net: dict[str, list[float]] = {}
        """Each batch's hold less its run-queue wait and the garbage collector's time in it."""
        removed = Removed()
        started = time.perf_counter()
        with Collections() as collections:
            while True:
                waited, collected, began = queue.waited(), collections.seconds, time.perf_counter()
                with sessions() as session, session.begin():
                    batch = retention.batch(session, now)
                held, waited_after = time.perf_counter() - began, queue.waited()
                kind = "idle" if batch.kind == "none" else batch.kind
                holds.setdefault(kind, []).append(held)
                slowest.append((held, len(slowest) + 1, kind, retention.size.share))
                if waited is not None and waited_after is not None:
                    waits = (waited_after - waited) / 1e9 + collections.seconds - collected
                    net.setdefault(kind, []).append(held - waits)
                if batch.kind == "none":
                    break
                retention.held(batch, held)
                smallest_share = min(smallest_share, retention.size.share)
                removed.add(batch.removed)
        elapsed = time.perf_counter() - started
        began = time.perf_counter()  # the idle leader's next check: the first one's reads are behind it
        with sessions() as session, session.begin():
            retention.batch(session, now)
        idle_again = time.perf_counter() - began
        engine.dispose()
    assert removed == planned, (removed, planned)
    return {
        "jobs": jobs,
        "filled": filled,
        "elapsed": elapsed,
        "removed": removed,
        "holds": holds,
        "net": net,
        "full_collections": (collections.full, collections.longest_full),
        "limits": retention.limits,
        "budget": retention.size.budget,
        "smallest_share": smallest_share,
        "slowest": sorted(slowest, reverse=True)[:3],
        "batches": len(slowest),
        "autovacuum": autovacuum,
        "idle_again": idle_again,
    }


def spread(seconds: list[float]) -> str:
    """The longest and the median, in milliseconds."""
    return f"longest {max(seconds) * 1000:6.1f} ms, median {statistics.median(seconds) * 1000:5.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, action="append", help="finished jobs (repeat; default 10,000 and 100,000)")
    parser.add_argument("--db", help="a PostgreSQL server's admin URL (default: a throwaway server of its own)")
    parser.add_argument("--fixed-limits", action="store_true", help="every batch takes the whole limits")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with server(args.db) as admin:
        for jobs in args.jobs or [10_000, 100_000]:
            report(run(admin, jobs, args.fixed_limits))
    return 0


def report(result: dict[str, Any]) -> None:
    """One size's figures, as in BENCHMARKS.md's Retention section."""
    jobs = result["jobs"]
    removed: Removed = result["removed"]
    print(f"\n{jobs:,} finished jobs + {LIVE_JOBS:,} live (filled in {result['filled']:.0f} s), {result['limits']}")
    print(
        f"  autovacuum {result['autovacuum']}; time budget a batch {result['budget'] * 1000:.0f} ms,"
        f" the batches shrank to {result['smallest_share']:.3f} of the limits at the smallest"
    )
    print(f"  removed {removed.rows():,} rows ({removed.words()}), compacted {removed.hours_compacted:,} hours")
    print(f"  in {result['elapsed']:.1f} s: {removed.rows() / result['elapsed']:,.0f} rows/s")
    net: dict[str, list[float]] = result["net"]
    for kind, holds in result["holds"].items():
        line = f"  {kind:>8}: {len(holds):5,} batches, {spread(holds)}"
        if kind in net:
            line += f"; net of CPU waits and GC: {spread(net[kind])}"
        print(line)
    longest = max(max(h) for h in result["holds"].values())
    over = sum(hold > 0.050 for holds in result["holds"].values() for hold in holds)
    print(f"  longest batch of all: {longest * 1000:.1f} ms (target ≤ 50 ms; {over} over it)", end="")
    if net:
        over = sum(hold > 0.050 for holds in net.values() for hold in holds)
        print(f"; net of CPU waits and GC: {max(max(h) for h in net.values()) * 1000:.1f} ms ({over} over it)")
    else:
        print()
    where = ", ".join(
        f"#{number} {kind} {held * 1000:.1f} ms at {share:.2f} of the limits"
        for held, number, kind, share in result["slowest"]
    )
    print(f"  the slowest of the {result['batches']:,} batches: {where}")
    full, longest_full = result["full_collections"]
    print(f"  full garbage collections during the batches: {full}, the longest {longest_full * 1000:.1f} ms of CPU")
    print(f"  the next idle check: {result['idle_again'] * 1000:.1f} ms")
    print(f"  load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
