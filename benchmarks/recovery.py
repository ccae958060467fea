"""Benchmark: what a new leader's recovery costs after 10k, 35k and all 69k jobs of the ITP trace,
from snapshots against replaying the whole input log (issue 39).

For each size, the simulator runs the trace's first N jobs on ``examples/itp-quota.yaml``,
recording the input log it feeds its core (``input_log.py``: the rows the quota service logs).
The rows go into a fresh PostgreSQL database, with the snapshots the leader would have written
on the way (one every ``--snapshot-every`` inputs, each of the core as it stood after that
input, its finished jobs forgotten, and kept as retention keeps them: the two newest). Then,
median of ``--repeat`` runs, in a fresh session each:

- *recovery*: ``service/snapshots.recover``: the newest snapshot read, checked and loaded, the
  inputs after it replayed;
- *whole log*: the same with no snapshot: every input replayed (what recovery cost before
  snapshots).

It also reports the stored size: the inputs table, the snapshots, and the database.

usage: python benchmarks/recovery.py [--jobs 10000 35000 69351] [--db URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import insert, text  # noqa: E402

from airflow_quota.core import snapshot  # noqa: E402
from airflow_quota.core.config import load_config  # noqa: E402
from airflow_quota.core.cycle import QuotaScheduler  # noqa: E402
from airflow_quota.core.inputs import ConfigurationApplied  # noqa: E402
from airflow_quota.service import snapshots  # noqa: E402
from airflow_quota.service.inputs import apply, from_row, to_row  # noqa: E402
from airflow_quota.sim.traces import trace_scenario  # noqa: E402
from airflow_quota.store.engine import make_engine, migrate, session_factory  # noqa: E402
from airflow_quota.store.models import Input, Snapshot  # noqa: E402
from airflow_quota.store.settings import DEFAULT_SNAPSHOT_EVERY, normalize  # noqa: E402
from benchmarks.input_log import Row, input_log  # noqa: E402
from benchmarks.itp_replay import first_jobs  # noqa: E402
from benchmarks.throwaway_postgres import fresh_database  # noqa: E402

QUOTA = ROOT / "examples" / "itp-quota.yaml"
SIZES = (10_000, 35_000, 69_351)
INSERT_CHUNK = 5_000
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
HEADER = "| jobs | inputs | recovery | snapshot (jobs, MB) | inputs after it | whole log | inputs table | database |"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def store_history(url: str, rows: list[Row], every: int) -> dict[str, Any]:
    """The rows as the input log, and the snapshots a leader would have left (the two newest)."""
    engine = make_engine(url)
    migrate(engine)
    core: QuotaScheduler | None = None
    kept: list[dict[str, Any]] = []
    started = time.perf_counter()
    with engine.begin() as connection:
        for first in range(0, len(rows), INSERT_CHUNK):
            chunk = rows[first : first + INSERT_CHUNK]
            connection.execute(
                insert(Input),
                [
                    {"id": first + i + 1, "kind": kind, "payload": payload, "at": at}
                    for i, (kind, payload, at) in enumerate(chunk)
                ],
            )
    for number, (kind, payload, at) in enumerate(rows, start=1):
        core, _ = apply(core, from_row(kind, payload), at)
        if number % every == 0 and core is not None:
            core.forget_finished()
            data = snapshot.encode(core)
            kept = [*kept[-1:], {"number": number, "data": data, "jobs": len(core.state.jobs), "at": at}]
    with engine.begin() as connection:
        for taken in kept:
            connection.execute(
                insert(Snapshot).values(
                    last_input_id=taken["number"],
                    taken_at=taken["at"],
                    format=snapshot.SNAPSHOT_FORMAT,
                    checksum=snapshot.checksum(taken["data"]),
                    size=len(taken["data"]),
                    jobs=taken["jobs"],
                    payload=taken["data"],
                )
            )
        sizes = {
            "inputs_mb": connection.scalar(text("SELECT pg_total_relation_size('quota_inputs')")) / 1e6,
            "snapshots_mb": connection.scalar(text("SELECT pg_total_relation_size('quota_snapshots')")) / 1e6,
            "database_mb": connection.scalar(text("SELECT pg_database_size(current_database())")) / 1e6,
        }
    engine.dispose()
    newest = kept[-1] if kept else None
    return {
        "stored_s": time.perf_counter() - started,
        "snapshot_after_input": newest["number"] if newest else None,
        "snapshot_jobs": newest["jobs"] if newest else None,
        "snapshot_mb": len(newest["data"]) / 1e6 if newest else None,
        **sizes,
    }


def time_recovery(url: str, repeat: int, whole_log: bool) -> tuple[float, int]:
    """Median seconds of ``snapshots.recover`` (from the snapshots, or with none: the whole
    log), and the inputs it replayed."""
    engine = make_engine(url)
    seconds = []
    replayed = 0
    for _ in range(repeat):
        with session_factory(engine)() as session:
            started = time.perf_counter()
            if whole_log:
                recovered = snapshots.recover_whole_log(session)
            else:
                recovered = snapshots.recover(session, inputs_pruned=False)
            seconds.append(time.perf_counter() - started)
            replayed = recovered.replayed
    engine.dispose()
    return statistics.median(seconds), replayed


def measure(jobs: int, admin_url: str, every: int, repeat: int) -> dict[str, Any]:
    say(f"{jobs:,} jobs: simulating and recording the input log ...")
    loaded = trace_scenario(first_jobs(jobs), load_config(QUOTA)).scenario
    rows = [(*to_row(ConfigurationApplied(loaded.config, None)), 0.0), *input_log(loaded)]
    with fresh_database(admin_url, prefix="quota_recovery") as database:
        url = normalize(database)
        say(f"{jobs:,} jobs: {len(rows):,} inputs; storing them and the snapshots ...")
        stored = store_history(url, rows, every)
        say(f"{jobs:,} jobs: timing recovery ...")
        recovery, tail = time_recovery(url, repeat, whole_log=False)
        whole, replayed = time_recovery(url, max(1, repeat // 2), whole_log=True)
    result = {
        "jobs": jobs,
        "inputs": len(rows),
        "recovery_s": recovery,
        "replayed_after_snapshot": tail,
        "whole_log_s": whole,
        "whole_log_inputs": replayed,
        **stored,
    }
    say(
        f"{jobs:,} jobs: recovery {recovery:.2f} s (snapshot of {stored['snapshot_jobs']} jobs,"
        f" {stored['snapshot_mb']:.2f} MB, + {tail:,} inputs) against the whole log {whole:.2f} s"
        f" ({replayed:,} inputs); inputs {stored['inputs_mb']:.0f} MB, database {stored['database_mb']:.0f} MB"
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--db", default=ADMIN_URL, help="a PostgreSQL server's admin URL (default %(default)s)")
    parser.add_argument("--snapshot-every", type=int, default=DEFAULT_SNAPSHOT_EVERY)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if any(n < 1 for n in args.jobs) or args.snapshot_every < 1 or args.repeat < 1:
        parser.error("--jobs, --snapshot-every and --repeat: must be at least 1")
    results = [measure(n, args.db, args.snapshot_every, args.repeat) for n in args.jobs]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            "| jobs | inputs | recovery | snapshot (jobs, MB) | inputs after it | whole log | inputs table | database |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in results:
            print(
                f"| {r['jobs']:,} | {r['inputs']:,} | {r['recovery_s']:.2f} s | {r['snapshot_jobs']:,},"
                f" {r['snapshot_mb']:.2f} | {r['replayed_after_snapshot']:,} | {r['whole_log_s']:.2f} s |"
                f" {r['inputs_mb']:.0f} MB | {r['database_mb']:.0f} MB |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
