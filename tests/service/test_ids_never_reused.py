"""An id is never given twice (migration 0016): on SQLite a table's rowid alone is the largest id in
it plus one, so the job submitted after a refused one (its row deleted at the refusal) got the
refused job's id, and with it the refusal's decision in its history. Found by retention's test
of decisions of no job. PostgreSQL's sequences never go back; both are checked.

- through the service: a refused submission, then another job: a new id, a history of its own;
- a SQLite database at revision 0015 with jobs run through it, migrated: every row and id kept,
  foreign keys and the live-name index still enforced, and the newest job's id, once its row is
  deleted, not given again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, delete, select, text
from sqlalchemy.exc import IntegrityError

from airflow_quota.exceptions import SubmissionRejected
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import head_revision, make_engine, migrate, session_factory
from airflow_quota.store.models import Attempt, Base, EventRow, JobRow, Request
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize
from tests.builders import request
from tests.service.test_big_ids import QUOTA, left_at, present_columns, stored


def refuse_when_taken_in(engine: Engine, job_id: int) -> None:
    """Make a stored submission name a share the configuration does not have, as when the store
    checked it against the configuration before the one in force: the leader refuses it."""
    with session_factory(engine)() as session, session.begin():
        row = session.get(JobRow, job_id)
        assert row is not None
        row.share, row.request = "gone", {**row.request, "share": "gone"}


def history(engine: Engine, job_id: int) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(select(EventRow.type, EventRow.job).where(EventRow.job_id == job_id))
        ]


def test_the_job_after_a_refused_one_gets_a_new_id_and_a_history_of_its_own(engine: Engine) -> None:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock)
    service.recover()
    refused = store.submit(request("refused", "qs1"), "fake", {"duration": 60}).id
    refuse_when_taken_in(engine, refused)
    service.step()
    assert history(engine, refused) == [("REJECTED", "refused")]
    with engine.connect() as connection:
        assert connection.scalar(select(JobRow.id).where(JobRow.id == refused)) is None  # its row went

    after = store.submit(request("after", "qs1"), "fake", {"duration": 60}).id
    clock.advance_to(1001.0)
    service.step()

    assert after > refused
    assert history(engine, after) == [("SUBMITTED", "after"), ("PLACED", "after")]
    assert history(engine, refused) == [("REJECTED", "refused")]


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(normalize(f"sqlite:///{tmp_path / 'quota.db'}"))
    yield engine
    engine.dispose()


def test_migrating_sqlite_keeps_every_row_and_id_and_never_gives_an_id_again(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    ids = left_at(engine, "0015")
    columns = present_columns(engine)
    before = stored(engine, columns)
    assert all(before[table] for table in ("quota_jobs", "quota_attempts", "quota_events", "quota_preemptions"))

    assert migrate(engine) == ("0015", head_revision(engine))

    assert stored(engine, columns) == before
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
        tables = connection.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'table'")).all()
        assert {name for name, sql in tables if "AUTOINCREMENT" in sql} == {
            table.name for table in Base.metadata.sorted_tables if table.kwargs.get("sqlite_autoincrement")
        }
    with engine.connect() as connection, pytest.raises(IntegrityError):  # foreign keys still enforced
        connection.execute(
            Attempt.__table__.insert().values(
                job_id=10**6, number=1, backend="fake", instance_type="x", count=1, placed_at=0.0
            )
        )
    store = QuotaStore(engine)
    with pytest.raises(SubmissionRejected, match="already named 'fourth'"):  # the live-name index kept
        store.submit(request("fourth", "qs1"), "fake", {"duration": 60})

    newest = max(ids.values())
    with session_factory(engine)() as session, session.begin():  # as a refusal or a prune deletes it
        for model in (Request, EventRow, Attempt):
            session.execute(delete(model).where(model.job_id == newest))
        session.execute(delete(JobRow).where(JobRow.id == newest))
    assert store.submit(request("next", "qs1"), "fake", {"duration": 60}).id == newest + 1
