"""Ids above 2^31 on PostgreSQL (issue 39): every id column and every column that refers to one
is BIGINT there (migration 0013), so jobs whose ids cross 2^31, and ids up to 2^63-1, are stored,
scheduled, read and changed through the store, the quota scheduler and the command line; and
migrating a database of revision 0012 keeps its rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, select, text

from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import _alembic_config, current_revision, head_revision, make_engine, migrate
from airflow_quota.store.models import Base
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize
from tests.builders import request
from tests.conftest import cli
from tests.postgres import continue_ids_after

G5 = "ml.g5.xlarge"
QUOTA = {
    "pool": {"capacity": {G5: 2}},
    "shares": [
        {"name": "qs1", "capacity_limits": {G5: 1}, "strategy": "LEND_AND_BORROW", "max_priority": 50},
        {"name": "qs2", "capacity_limits": {G5: 1}, "strategy": "LEND_AND_BORROW"},
    ],
}
ID_COLUMNS = {
    ("quota_config_versions", "id"),
    ("quota_requests", "id"),
    ("quota_requests", "job_id"),
    ("quota_jobs", "id"),
    ("quota_attempts", "job_id"),
    ("quota_task_reports", "job_id"),
    ("quota_preemptions", "id"),
    ("quota_preemptions", "job_id"),
    ("quota_alerts", "id"),
    ("quota_alerts", "job_id"),
    ("quota_events", "id"),
    ("quota_events", "job_id"),
    ("quota_inputs", "id"),
}
"""Every id column and every column that holds a job's id."""
SEQUENCED = sorted(table for table, column in ID_COLUMNS if column == "id")
"""The tables whose ``id`` a sequence numbers."""


@pytest.fixture
def postgres(postgres_url: str) -> Iterator[Engine]:
    """A fresh PostgreSQL database, not migrated."""
    engine = make_engine(normalize(postgres_url))
    yield engine
    engine.dispose()


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def column_types(engine: Engine) -> dict[tuple[str, str], str]:
    """The PostgreSQL type of each column of ``ID_COLUMNS``."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'public'"
            )
        ).all()
    return {(table, column): kind for table, column, kind in rows if (table, column) in ID_COLUMNS}


def sequence_types(engine: Engine) -> dict[str, str]:
    with engine.connect() as connection:
        return {
            table: connection.scalar(
                text(
                    "SELECT data_type FROM information_schema.sequences "
                    "WHERE sequence_name = split_part(pg_get_serial_sequence(:table, 'id'), '.', 2)"
                ),
                {"table": table},
            )
            for table in SEQUENCED
        }


def run_jobs(engine: Engine, jobs: list[tuple[str, str]], start: float = 1000.0) -> dict[str, int]:
    """Apply the quota, submit ``jobs`` (name, share; one instance each) one after the other and
    let the quota scheduler take each in, place and start it (a qs2 job takes back the instance
    a qs1 job borrows: a preemption), from ``start`` on its clock; their ids by name."""
    clock = ManualClock(start)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    # retention off: at revision 0012, before it, its tables do not exist yet
    service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock, retention_days=0)
    ids = {}
    for name, share in jobs:
        ids[name] = store.submit(request(name, share), "fake", {"duration": 3600}).id
        for _ in range(5):  # take in, place (preempting), stop, start
            clock.advance_to(clock.now() + 1.0)
            service.step()
    return ids


JOBS = [("first", "qs1"), ("second", "qs1"), ("third", "qs2"), ("fourth", "qs1")]
"""first runs on qs1's instance, second borrows qs2's, third takes it back (second preempted),
fourth waits."""


def stored(engine: Engine, columns: dict[str, list[str]] | None = None) -> dict[str, list[Any]]:
    """Every row of every table the database has, in id order, of the ``columns`` given per table
    (default: every column it has now): what a migration must keep."""
    with engine.connect() as connection:
        columns = present_columns(engine) if columns is None else columns
        return {
            table.name: [
                tuple(row)
                for row in connection.execute(
                    select(*(table.c[name] for name in columns[table.name])).order_by(*table.primary_key.columns)
                )
            ]
            for table in Base.metadata.sorted_tables
            if table.name in columns
        }


def present_columns(engine: Engine) -> dict[str, list[str]]:
    """The model's columns each table of the database has now."""
    with engine.connect() as connection:
        inspector = inspect(connection)
        tables = {table.name: table for table in Base.metadata.sorted_tables}
        return {
            name: [column.name for column in tables[name].columns if column.name in have]
            for name in inspector.get_table_names()
            if name in tables and (have := {c["name"] for c in inspector.get_columns(name)})
        }


def left_at(engine: Engine, revision: str) -> dict[str, int]:
    """The database an older version left: ``JOBS`` run by this version, then the schema taken
    back down to ``revision`` (this version writes columns the old schema lacks); their ids."""
    migrate(engine)
    ids = run_jobs(engine, JOBS)
    command.downgrade(_alembic_config(engine), revision)
    assert current_revision(engine) == revision
    return ids


@pytest.mark.parametrize("last", [2**31 - 3, 2**63 - 100], ids=["crossing 2^31", "near 2^63"])
def test_jobs_with_ids_beyond_32_bits_are_stored_scheduled_read_and_changed(postgres: Engine, last: int) -> None:
    migrate(postgres)
    continue_ids_after(url_of(postgres), last)
    ids = run_jobs(postgres, JOBS)
    assert sorted(ids.values()) == [last + 1, last + 2, last + 3, last + 4]
    store = QuotaStore(postgres)
    states = {name: store.job(job_id).state for name, job_id in ids.items()}  # type: ignore[union-attr]
    assert states == {"first": "RUNNING", "second": "RUNNABLE", "third": "RUNNING", "fourth": "RUNNABLE"}, states
    assert [a.job_id for a in store.attempts(ids["third"])] == [ids["third"]]
    with postgres.connect() as connection:
        assert connection.scalar(text("SELECT min(job_id) FROM quota_events WHERE job_id IS NOT NULL")) > 2**31 - 3
        assert connection.scalar(text("SELECT min(id) FROM quota_inputs")) == last + 1
        assert connection.scalar(text("SELECT count(*) FROM quota_preemptions WHERE job_id > :l"), {"l": last}) > 0

    url = url_of(postgres)
    big = str(ids["third"])
    shown = cli("jobs", "show", big, "--db", url)
    assert shown.code == 0 and "Traceback" not in shown.stderr, shown
    assert "third" in shown.stdout and big in shown.stdout, shown.stdout
    raised = cli("jobs", "set-priority", big, "40", "--db", url, "--wait", "0")
    assert raised.code == 0 and "Traceback" not in raised.stderr, raised
    cancelled = cli("jobs", "cancel", str(ids["first"]), "--db", url)
    assert cancelled.code == 0 and "Traceback" not in cancelled.stderr, cancelled
    assert store.pending_requests() == 2  # both asked of the quota scheduler, for the big ids
    absent = cli("jobs", "show", str(last + 1000 if last < 2**62 else 2**63 - 1), "--db", url)
    assert (absent.code, "Traceback" in absent.stderr) == (2, False), absent
    assert absent.stderr.startswith("job: no job"), absent


def test_migrating_from_0012_keeps_every_row_and_widens_every_id(postgres: Engine) -> None:
    config = _alembic_config(postgres)
    ids = left_at(postgres, "0012")
    old = column_types(postgres)
    assert set(old) == ID_COLUMNS and set(old.values()) == {"integer"}, old
    columns = present_columns(postgres)
    before = stored(postgres, columns)
    assert all(before[table] for table in ("quota_jobs", "quota_attempts", "quota_events", "quota_preemptions"))

    assert migrate(postgres) == ("0012", head_revision(postgres))
    assert stored(postgres, columns) == before
    assert set(column_types(postgres).values()) == {"bigint"}
    assert set(sequence_types(postgres).values()) == {"bigint"}
    with postgres.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []

    after = run_jobs(postgres, [("next", "qs1")], start=2000.0)  # the sequences go on where they were
    assert after["next"] == max(ids.values()) + 1
    continue_ids_after(url_of(postgres), 2**31)
    assert run_jobs(postgres, [("big", "qs1")], start=3000.0)["big"] == 2**31 + 1

    command.downgrade(config, "0013")
    with pytest.raises(Exception, match="out of range"):  # back down is refused while an id needs 64 bits
        command.downgrade(config, "0012")
    assert current_revision(postgres) == "0013"
