"""``store/bulk.update_by_key``, the leader's one way to update rows by key (an executemany for
each set of columns): each row gets its values (NULLs and all, an int in a float column), a key
given twice keeps its last row, and rows not given stay as they were; SQLite and PostgreSQL.
``pipelined``: the writes of its block all land at its end, and when one of them fails, its error
is raised there and none of them lands; with ``commit``, the COMMIT goes in the same round trip,
and a block that fails hands its connection back out of the failed transaction (the next use of
the pool's connection would fail). ``insert_returning_id`` and ``with_defaults``: what a submission
hands back is the row stored."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError

from airflow_quota.store.bulk import insert_returning_id, insert_rows, pipelined, update_by_key, with_defaults
from airflow_quota.store.engine import session_factory
from airflow_quota.store.models import Attempt, JobRow, Request
from airflow_quota.store.repository import QuotaStore
from tests.builders import request

QUOTA = {
    "pool": {"capacity": {"ml.g5.xlarge": 4}},
    "shares": [{"name": "team", "capacity_limits": {"ml.g5.xlarge": 4}}],
}
COLUMNS = (JobRow.state, JobRow.reason, JobRow.gpu_hours, JobRow.pending_deadline, JobRow.position_in_share)


def jobs(engine: Engine) -> dict[int, tuple[object, ...]]:
    with engine.connect() as connection:
        return {row[0]: tuple(row[1:]) for row in connection.execute(select(JobRow.id, *COLUMNS))}


def test_each_row_gets_its_values_the_last_for_a_key_given_twice_and_the_rest_stay(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    a, b, c = (store.submit(request(name, "team"), "fake", {"duration": 1}).id for name in "abc")
    untouched = jobs(engine)[c]
    rows = [
        {"id": a, "state": "RUNNING", "reason": None, "gpu_hours": 2, "pending_deadline": None, "position_in_share": 3},
        {"id": b, "state": "FAILED", "reason": "ExitCode:1", "gpu_hours": 0.5, "pending_deadline": None,
         "position_in_share": None},
        {"id": a, "state": "SUCCEEDED", "reason": None, "gpu_hours": 1.25, "pending_deadline": None,
         "position_in_share": None},
    ]  # fmt: skip
    with session_factory(engine)() as session, session.begin():
        update_by_key(session, JobRow, rows)
        update_by_key(session, Request, [{"id": 1, "handled": True, "outcome": "accepted", "error": None}])

    stored = jobs(engine)
    assert stored[a] == ("SUCCEEDED", None, 1.25, None, None)
    assert stored[b] == ("FAILED", "ExitCode:1", 0.5, None, None)
    assert stored[c] == untouched
    assert isinstance(stored[b][2], float)
    with engine.connect() as connection:
        handled = connection.execute(select(Request.handled, Request.outcome).where(Request.id == 1)).one()
    assert tuple(handled) == (True, "accepted")


def test_a_float_column_given_only_ints_or_only_nulls(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    a, b = (store.submit(request(name, "team"), "fake", {"duration": 1}).id for name in "ab")
    with session_factory(engine)() as session, session.begin():
        update_by_key(session, JobRow, [{"id": a, "gpu_hours": 3}, {"id": b, "gpu_hours": 4}])
        update_by_key(session, JobRow, [{"id": a, "pending_deadline": None}, {"id": b, "pending_deadline": None}])
    stored = jobs(engine)
    assert (stored[a][2], stored[b][2]) == (3.0, 4.0)
    assert (stored[a][3], stored[b][3]) == (None, None)


def attempt(job_id: int, number: int) -> dict[str, object]:
    return {
        "job_id": job_id, "number": number, "backend": "fake", "instance_type": "ml.g5.xlarge", "count": 1,
        "training_plan": None, "borrowed": 0, "placed_at": 1.0, "action": "START", "stop_grace": 0.0,
        "status": "STARTING", "running_since": None, "ended_at": None, "reason": None, "external_name": None,
        "external_arn": None,
    }  # fmt: skip


def attempts(engine: Engine) -> list[tuple[int, int, str]]:
    with engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(select(Attempt.job_id, Attempt.number, Attempt.status)))


def test_the_writes_of_a_pipelined_block_all_land(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    a, b = (store.submit(request(name, "team"), "fake", {"duration": 1}).id for name in "ab")
    with session_factory(engine)() as session, session.begin(), pipelined(session):
        insert_rows(session, Attempt, [attempt(a, 1), attempt(b, 1)])
        update_by_key(session, Attempt, [{"job_id": a, "number": 1, "status": "RUNNING"}])
        insert_rows(session, Attempt, [attempt(a, 2)])
    assert attempts(engine) == [(a, 1, "RUNNING"), (a, 2, "STARTING"), (b, 1, "STARTING")]


def test_a_write_that_fails_in_a_pipelined_block_fails_the_block_and_none_lands(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    a = store.submit(request("a", "team"), "fake", {"duration": 1}).id
    with pytest.raises(IntegrityError), session_factory(engine)() as session, session.begin(), pipelined(session):
        insert_rows(session, Attempt, [attempt(a, 1)])
        insert_rows(session, Attempt, [attempt(a, 1)])  # the same key again
        update_by_key(session, JobRow, [{"id": a, "state": "RUNNING"}])
    assert attempts(engine) == []
    assert jobs(engine)[a][0] == "SUBMITTED", "the update after the failed insert landed"


def test_a_committing_pipelined_block_commits_and_a_failed_one_leaves_nothing(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    a, b = (store.submit(request(name, "team"), "fake", {"duration": 1}).id for name in "ab")
    with session_factory(engine)() as session:
        with pipelined(session, commit=True):
            insert_rows(session, Attempt, [attempt(a, 1)])
        assert not session.in_transaction(), "the block did not commit"
    with pytest.raises(IntegrityError), session_factory(engine)() as session, pipelined(session, commit=True):
        insert_rows(session, Attempt, [attempt(b, 1)])
        insert_rows(session, Attempt, [attempt(a, 1)])  # already there: the COMMIT must not happen
    assert attempts(engine) == [(a, 1, "STARTING")]


def test_a_row_inserted_for_its_id_holds_what_the_store_holds(engine: Engine) -> None:
    """``insert_returning_id`` and ``with_defaults``: the row as given, every other column at its
    default, is the row the database keeps (what ``QuotaStore.submit`` hands back)."""
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    given = {"name": "x", "share": "team", "priority": 3, "backend": "fake", "request": {"name": "x"},
             "training": {}, "submitted_at": 12.5, "state": "SUBMITTED"}  # fmt: skip
    with session_factory(engine)() as session, session.begin():
        job_id = insert_returning_id(session, JobRow, given)
    expected = with_defaults(JobRow, given)
    assert expected["attempts"] == 0 and expected["dag_id"] is None and expected["wait_seconds"] == 0.0
    with engine.connect() as connection:
        stored = connection.execute(select(JobRow.__table__).where(JobRow.id == job_id)).mappings().one()
    assert {name: stored[name] for name in expected} == expected
    returned = store.submit(request("y", "team"), "fake", {"duration": 1}, dag_id="d")
    with engine.connect() as connection:
        row = connection.execute(select(JobRow.__table__).where(JobRow.id == returned.id)).mappings().one()
    assert {name: getattr(returned, name) for name in row} == dict(row)


def test_a_compare_and_set_changes_only_the_rows_that_still_hold_the_value(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    a, b = (store.submit(request(name, "team"), "fake", {"duration": 1}).id for name in "ab")
    with session_factory(engine)() as session, session.begin():
        insert_rows(session, Attempt, [attempt(a, 1), attempt(b, 1)])
        update_by_key(session, Attempt, [{"job_id": b, "number": 1, "status": "RUNNING"}])
    with session_factory(engine)() as session, session.begin(), pipelined(session):
        update_by_key(
            session,
            Attempt,
            [{"job_id": a, "number": 1, "status": "STOPPING"}, {"job_id": b, "number": 1, "status": "STOPPING"}],
            only_if={"status": "STARTING"},
        )
    assert attempts(engine) == [(a, 1, "STOPPING"), (b, 1, "RUNNING")]
