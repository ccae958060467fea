"""``store/bulk.update_by_key``, the leader's one way to update rows by key (an executemany for
each set of columns): each row gets its values (NULLs and all, an int in a float column), a key
given twice keeps its last row, and rows not given stay as they were; SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Engine, select

from airflow_quota.store.bulk import update_by_key
from airflow_quota.store.engine import session_factory
from airflow_quota.store.models import JobRow, Request
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
