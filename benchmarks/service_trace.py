"""Benchmark: the Microsoft ITP trace (69,351 jobs, ``data/traces/itp-2021``) through the real
quota service on PostgreSQL, decision for decision against ``airflow-quota simulate --trace``.

    python benchmarks/service_trace.py                      # the whole trace (clean run)
    python benchmarks/service_trace.py --jobs 2000          # its first 2,000 jobs
    python benchmarks/service_trace.py --measure-recovery   # and recovery + database size at 10k, 35k, all
    python benchmarks/service_trace.py --retention-days 90 --retention-days 7   # and pruned at the end
    python benchmarks/service_trace.py --db postgresql://postgres@127.0.0.1:5432/test --json
    python benchmarks/service_trace.py --chaos --jobs 10000   # the chaos run: benchmarks/trace_chaos.py

The quota is ``examples/itp-quota.yaml`` (ten LEND_AND_BORROW shares, one per cluster, over
1,200 V100 GPUs: see ``benchmarks/itp_replay.py``). The jobs go through the store's
``submit`` at their submission instants on a manual clock; one ``QuotaService.step`` runs at
each instant where something happens, with the fake backend in memory
(``benchmarks/service_replay.py``). Clean mode: every decision (placements, preemptions,
requeues, ends, alerts: the fields ``tests/service/test_equivalence.py`` compares) must equal
the simulator's on the same jobs, event for event; the first difference is reported and ends
the run (exit status 1).

The database: a PostgreSQL server the benchmark starts itself in a temporary directory
(``benchmarks/throwaway_postgres.py``), or a fresh database created on the server of ``--db``
(an admin URL) and dropped at the end.

``--measure-recovery``: when 10,000 and 35,000 jobs have been submitted, and at the end, the
time a new leader's ``QuotaService.recover()`` takes on the database as it stands (a second
service on the same database, its own fake backend), and the database's size, whole and per
table. ``--snapshot-every N`` passes ``snapshot_every`` to the services when ``QuotaService``
has it.

Progress goes to stderr every few seconds: jobs submitted and finished, the simulated day,
decisions a second, steps a second.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_quota.core.config import load_config  # noqa: E402
from airflow_quota.sim.scenario import LoadedScenario  # noqa: E402
from airflow_quota.sim.traces import trace_scenario  # noqa: E402
from airflow_quota.store.backend_names import TEST_BACKENDS_VARIABLE  # noqa: E402
from benchmarks.itp_replay import first_jobs  # noqa: E402
from benchmarks.service_replay import (  # noqa: E402
    ReplayBackend,
    ServiceReplay,
    comparable,
    first_difference,
    first_difference_at,
    simulated_decisions,
)
from benchmarks.step_phases import StepPhases  # noqa: E402
from benchmarks.step_phases import show as show_phases  # noqa: E402

os.environ[TEST_BACKENDS_VARIABLE] = "fake"  # the trace's jobs run on the fake backend

QUOTA = ROOT / "examples" / "itp-quota.yaml"
TRACE_JOBS = 69_351
MEASURE_AT = (10_000, 35_000)
"""Jobs submitted when recovery and the database's size are measured (and at the end)."""
PROGRESS_SECONDS = 5.0
POLL_WORKERS = 256
"""Starts and stops one step may make at once: more than any instant of the whole trace has (57
placements, 64 preemptions), so each is made in its instant's step, as the simulator makes it."""


def itp_scenario(jobs: int | None = None, quota: Path = QUOTA) -> LoadedScenario:
    """The first ``jobs`` jobs of the ITP trace (all for None) as a scenario on ``quota``, as
    ``airflow-quota simulate --trace itp:data/traces/itp-2021 --quota examples/itp-quota.yaml``
    builds it."""
    return trace_scenario(first_jobs(jobs), load_config(quota)).scenario


@contextlib.contextmanager
def benchmark_database(admin: str | None) -> Iterator[str]:
    """The URL of an empty database for the run: on a server started here, or a fresh database
    on the server of ``admin`` (dropped after)."""
    from benchmarks.throwaway_postgres import ThrowawayPostgres, fresh_database

    if admin is None:
        with ThrowawayPostgres() as server:
            yield server.url
        return
    with fresh_database(admin, prefix="quota_trace") as url:
        yield url


def database_size(engine: Any) -> dict[str, int]:
    """The database's size in bytes (``pg_database_size``) under ``"database"``, and each quota
    table's with its indexes and TOAST (``pg_total_relation_size``), largest first."""
    from sqlalchemy import text

    with engine.connect() as connection:
        total = int(connection.scalar(text("SELECT pg_database_size(current_database())")))
        rows = connection.execute(
            text(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind = 'r' AND n.nspname = 'public' ORDER BY 2 DESC"
            )
        ).all()
    return {"database": total, **{str(name): int(size) for name, size in rows}}


def measure_recovery(replay: ServiceReplay, engine: Any, service_options: dict[str, Any]) -> dict[str, Any]:
    """What a new leader's recovery costs on the database as it stands: a second
    ``QuotaService`` on the same database (its own fake backend, so the replay's attempts are
    not touched) runs ``recover()``, timed; and the database's size."""
    from airflow_quota.service.clock import ManualClock
    from airflow_quota.service.scheduler import QuotaService

    clock = ManualClock(replay.clock.now())
    standby = QuotaService(
        engine,
        {"fake": ReplayBackend(clock.now)},
        clock=clock,
        holder="recovery-probe",
        cycle_seconds=float("inf"),
        refresh_views_seconds=float("inf"),
        **service_options,
    )
    started = time.perf_counter()
    standby.recover()
    seconds = time.perf_counter() - started
    assert standby.scheduler is not None
    same = len(standby.scheduler.state.jobs) == len(replay.service.scheduler.state.jobs)  # type: ignore[union-attr]
    standby.poller.stop()
    return {
        "jobs_submitted": replay.next_event,
        "simulated_day": replay.simulated_seconds / 86400,
        "recovery_seconds": seconds,
        "recovered_jobs_match": same,
        "size_bytes": database_size(engine),
    }


def pruned_size(replay: ServiceReplay, engine: Any, retention_days: float, options: dict[str, Any]) -> dict[str, Any]:
    """Prune the database as the leader would with ``retention_days`` at the replay's last
    instant (``Retention.batches`` until nothing is left), compact it (``VACUUM FULL``: what
    stays, not the space PostgreSQL keeps for reuse), and measure recovery and the size then."""
    from sqlalchemy import text

    from airflow_quota.store.engine import session_factory
    from airflow_quota.store.retention import Retention

    started = time.perf_counter()
    batches = list(Retention(retention_days).batches(session_factory(engine), replay.clock.now()))
    seconds = time.perf_counter() - started
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM FULL"))
        jobs = int(connection.scalar(text("SELECT count(*) FROM quota_jobs")))
        live = int(
            connection.scalar(text("SELECT count(*) FROM quota_jobs WHERE state NOT IN ('SUCCEEDED', 'FAILED')"))
        )
        hours = connection.execute(text("SELECT count(*), min(hour), max(hour) FROM quota_share_hours")).one()
    measure = measure_recovery(replay, engine, options)
    return {
        "retention_days": retention_days,
        "batches": len(batches),
        "prune_seconds": seconds,
        "jobs_kept": jobs,
        "live_jobs": live,
        "share_hours": {"rows": int(hours[0]), "first": hours[1], "last": hours[2]},
        **measure,
    }


FORECAST_INTERVAL: float | None = None
"""``--forecast-interval``: the replay's ``QuotaService(forecast_interval=...)``, or none."""


def _options(snapshot_every: int | None, view_seconds: float | None = None) -> dict[str, Any]:
    """Keyword arguments for ``QuotaService`` beyond the replay's: ``snapshot_every`` when
    given (refused when this version of the service has no such parameter); ``view_seconds``,
    by default the scheduler process's (``VIEW_SECONDS``), when this version has it."""
    from airflow_quota.service import scheduler
    from airflow_quota.service.scheduler import QuotaService

    parameters = inspect.signature(QuotaService).parameters
    options: dict[str, Any] = {}
    if "view_seconds" in parameters:
        options["view_seconds"] = scheduler.VIEW_SECONDS if view_seconds is None else view_seconds
    elif view_seconds is not None:
        raise SystemExit("--view-seconds: this QuotaService has no view_seconds parameter yet")
    if snapshot_every is None:
        return options
    if "snapshot_every" not in parameters:
        raise SystemExit("--snapshot-every: this QuotaService has no snapshot_every parameter yet")
    return {**options, "snapshot_every": snapshot_every}


class Progress:
    """A line on stderr every ``PROGRESS_SECONDS``: jobs submitted and finished, the simulated
    day, decisions and steps a second since the previous line."""

    def __init__(self, total_jobs: int) -> None:
        self.total_jobs = total_jobs
        self.started = self.last = time.perf_counter()
        self.last_decisions = 0
        self.last_steps = 0

    def due(self) -> bool:
        return time.perf_counter() - self.last >= PROGRESS_SECONDS

    def show(self, replay: ServiceReplay, decisions: int) -> None:
        now = time.perf_counter()
        elapsed = now - self.last
        scheduler = replay.service.scheduler
        finished = 0 if scheduler is None else len(replay.ids) - len(scheduler.state.live_names)  # forgotten too
        print(
            f"[{now - self.started:7.0f} s] jobs {replay.next_event:,}/{self.total_jobs:,} submitted, "
            f"{finished:,} finished | day {replay.simulated_seconds / 86400:5.1f} | "
            f"{(decisions - self.last_decisions) / elapsed:6.0f} decisions/s, "
            f"{(replay.steps - self.last_steps) / elapsed:5.0f} steps/s",
            file=sys.stderr,
            flush=True,
        )
        self.last, self.last_decisions, self.last_steps = now, decisions, replay.steps


def clean_run(
    loaded: LoadedScenario,
    url: str,
    expected: list[dict[str, Any]],
    measure: bool = False,
    snapshot_every: int | None = None,
    retention_days: list[float] | None = None,
    view_seconds: float | None = None,
    phases: bool = False,
) -> dict[str, Any]:
    """The scenario through the service on the (empty) database at ``url``, its decisions
    compared with ``expected`` as they are committed; stops at the first difference. At the end,
    for each of ``retention_days`` (longest first) the database pruned and measured. With
    ``phases``, the step's phases timed (``step_phases.py``)."""
    from airflow_quota.store.engine import make_engine, migrate
    from airflow_quota.store.settings import normalize

    engine = make_engine(normalize(url))
    migrate(engine)
    options = _options(snapshot_every, view_seconds)
    if FORECAST_INTERVAL is not None:
        options["forecast_interval"] = FORECAST_INTERVAL
    replay = ServiceReplay(loaded, engine, poll_workers=POLL_WORKERS, service_options=options, listing=True)
    timer = StepPhases.timing(replay) if phases else None
    total = len(loaded.events)
    marks = [m for m in MEASURE_AT if m < total] if measure else []
    measures: list[dict[str, Any]] = []
    served: list[dict[str, Any]] = []
    last_id = 0
    checked = 0
    difference: str | None = None
    progress = Progress(total)
    started = time.perf_counter()
    cpu_started = time.process_time()

    def take_decisions() -> None:
        nonlocal last_id, checked, difference
        records, last_id = replay.records(last_id)
        served.extend(comparable(records))
        index = first_difference_at(expected, served, checked)
        if index < len(served):
            difference = first_difference(expected, served)
        checked = index

    while replay.advance():
        if marks and replay.next_event >= marks[0]:
            marks.pop(0)
            measures.append(measure_recovery(replay, engine, options))
            _show_measure(measures[-1])
        if progress.due():
            take_decisions()
            progress.show(replay, len(served))
            if difference is not None:
                break
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    if difference is None:
        take_decisions()
        if difference is None and len(served) != len(expected):
            difference = first_difference(expected, served)
    if measure and difference is None:
        measures.append(measure_recovery(replay, engine, options))
        _show_measure(measures[-1])
    pruned: list[dict[str, Any]] = []
    for days in sorted(retention_days or [], reverse=True) if difference is None else []:
        pruned.append(pruned_size(replay, engine, days, options))
        _show_measure(pruned[-1], f"retention {days:g} days ({pruned[-1]['jobs_kept']:,} jobs kept, compacted)")
    engine.dispose()
    return {
        "jobs": total,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "steps": replay.steps,
        "decisions": len(served),
        "expected_decisions": len(expected),
        "identical": difference is None,
        "first_difference": difference,
        "simulated_days": replay.simulated_seconds / 86400,
        "client_calls_refused": replay.rejected,
        "measures": measures,
        "retention": pruned,
        "phases": timer.table() if timer is not None else [],
        "forecasts_refreshed": replay.service.forecasts.refreshed if replay.service.forecasts is not None else None,
    }


def _show_measure(measure: dict[str, Any], what: str | None = None) -> None:
    sizes = measure["size_bytes"]
    tables = ", ".join(f"{name} {size / 2**20:,.1f}" for name, size in list(sizes.items())[1:7])
    when = what or f"at {measure['jobs_submitted']:,} jobs (day {measure['simulated_day']:.1f})"
    print(
        f"  {when}: recovery {measure['recovery_seconds']:.2f} s; "
        f"database {sizes['database'] / 2**20:,.1f} MiB ({tables} MiB)",
        file=sys.stderr,
        flush=True,
    )


def main() -> int:
    if "--chaos" in sys.argv[1:]:  # the chaos run: benchmarks/trace_chaos.py, given the other arguments
        from benchmarks import trace_chaos

        return trace_chaos.main([arg for arg in sys.argv[1:] if arg != "--chaos"])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=None, help=f"the first N jobs (default all {TRACE_JOBS:,})")
    parser.add_argument("--db", help="an admin URL of a PostgreSQL server to use (default: start one here)")
    parser.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    parser.add_argument(
        "--measure-recovery", action="store_true", help="recovery time and database size at 10k, 35k jobs and the end"
    )
    parser.add_argument("--snapshot-every", type=int, help="QuotaService's snapshot_every (when it has it)")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the service run to this file")
    parser.add_argument(
        "--phases", action="store_true", help="time each phase of the step and the submissions (wall and CPU)"
    )
    parser.add_argument(
        "--forecast-interval",
        type=float,
        help="QuotaService's forecast_interval: the forecast refreshed in its worker process beside the "
        "replay (the trace's virtual seconds; a refresh starts once the last has ended), default none",
    )
    parser.add_argument(
        "--view-seconds",
        type=float,
        help="QuotaService's view_seconds (default: the scheduler process's, VIEW_SECONDS; 0: in every commit)",
    )
    parser.add_argument(
        "--retention-days",
        type=float,
        action="append",
        metavar="DAYS",
        help="at the end, prune as the leader would with this retention, compact, and measure again "
        "(repeatable: longest first)",
    )
    args = parser.parse_args()
    if args.jobs is not None and not 1 <= args.jobs <= TRACE_JOBS:
        print(f"error: --jobs: {args.jobs} must be from 1 to {TRACE_JOBS:,}", file=sys.stderr)
        return 2
    if any(days <= 0 for days in args.retention_days or []):
        print("error: --retention-days: each must be > 0 (0 keeps everything: measured without it)", file=sys.stderr)
        return 2
    if args.snapshot_every is not None and args.snapshot_every < 1:
        print(f"error: --snapshot-every: {args.snapshot_every} must be ≥ 1", file=sys.stderr)
        return 2
    if args.view_seconds is not None and not args.view_seconds >= 0:
        print(f"error: --view-seconds: {args.view_seconds} must be ≥ 0", file=sys.stderr)
        return 2
    global FORECAST_INTERVAL
    FORECAST_INTERVAL = args.forecast_interval
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    loaded = itp_scenario(args.jobs)
    expected = simulated_decisions(loaded)
    simulated = time.perf_counter() - started
    print(
        f"the simulator: {len(loaded.events):,} jobs, {len(expected):,} decisions compared, {simulated:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    with benchmark_database(args.db) as url:
        if args.profile is not None:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        result = clean_run(
            loaded,
            url,
            expected,
            args.measure_recovery,
            args.snapshot_every,
            args.retention_days,
            args.view_seconds,
            args.phases,
        )
        if args.profile is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
    result["simulator_seconds"] = simulated
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _show(result)
    return 0 if result["identical"] else 1


def _show(result: dict[str, Any]) -> None:
    print(
        f"{result['jobs']:,} ITP jobs through the quota service (PostgreSQL, fake backend, manual clock): "
        f"{result['seconds']:,.1f} s ({result['cpu_seconds']:,.1f} s CPU in this process), "
        f"{result['steps']:,} steps ({result['steps'] / result['seconds']:,.0f}/s), "
        f"{result['decisions']:,} decisions ({result['decisions'] / result['seconds']:,.0f}/s), "
        f"{result['simulated_days']:.1f} simulated days"
    )
    if result["client_calls_refused"]:
        refused = result["client_calls_refused"]
        print(f"the store refused {len(refused):,} client calls, the first: {refused[0]}")
    if result["identical"]:
        print(f"decisions: identical to the simulator's ({result['expected_decisions']:,})")
    else:
        print(f"decisions DIFFER from the simulator's:\n{result['first_difference']}")
    for measure in result["measures"]:
        sizes = measure["size_bytes"]
        print(
            f"at {measure['jobs_submitted']:>6,} jobs: recovery {measure['recovery_seconds']:6.2f} s, "
            f"database {sizes['database'] / 2**20:8,.1f} MiB"
        )
    if result["forecasts_refreshed"] is not None:
        print(f"forecasts refreshed beside it: {result['forecasts_refreshed']:,}")
    if result["phases"]:
        show_phases(result["phases"])
    for pruned in result["retention"]:
        print(
            f"retention {pruned['retention_days']:g} days at the end: {pruned['jobs_kept']:,} jobs kept "
            f"({pruned['live_jobs']:,} live), {pruned['batches']:,} batches in {pruned['prune_seconds']:.1f} s; "
            f"compacted database {pruned['size_bytes']['database'] / 2**20:,.1f} MiB; "
            f"recovery {pruned['recovery_seconds']:.2f} s"
        )


if __name__ == "__main__":
    sys.exit(main())
