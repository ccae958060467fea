"""The leader lease on PostgreSQL when its holder froze in the middle of a transaction that locks
the lease row (SIGSTOP, a stalled VM): the standby takes the lease once it has run out, by ending
that session, and never while the lease still holds.

The frozen leader here is a connection left in its transaction after an ``executemany`` (psycopg
runs one as a pipeline): the server's ``idle_in_transaction_session_timeout`` does not end such
a session (PostgreSQL 15, psycopg 3.3), which is how the frozen-leader test of
``test_database_faults.py`` sometimes waited past its bound.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Connection, Engine, select, text
from sqlalchemy.exc import InternalError, OperationalError

from airflow_quota.store.lock import LeaderLease, leader_lock
from airflow_quota.store.models import Leader
from tests.waiting import wait_for


@pytest.fixture
def db_url(postgres_url: str) -> str:
    """PostgreSQL only: the lease's row locks and sessions are PostgreSQL's (``conftest.engine`` migrates it)."""
    return postgres_url


def frozen_mid_transaction(engine: Engine, lease: LeaderLease) -> Connection:
    """A connection of ``lease``'s holder inside a decision transaction: fenced (the lease row
    locked), then an ``executemany``, then nothing more, as a leader stopped right there."""
    connection = engine.connect()
    connection.exec_driver_sql("SET idle_in_transaction_session_timeout = 500")
    connection.commit()
    connection.begin()
    lease.fence(connection)
    connection.execute(
        text("UPDATE quota_leader SET backends = :backends WHERE name = :name"),
        [{"backends": "fake", "name": "scheduler"}, {"backends": "fake", "name": "nobody"}],
    )
    return connection


def test_a_standby_takes_a_run_out_lease_from_a_leader_frozen_mid_transaction(engine: Engine) -> None:
    old = leader_lock(engine, "old", lease_seconds=1.0)
    assert old.acquire()
    frozen = frozen_mid_transaction(engine, old)
    standby = leader_lock(engine, "standby", lease_seconds=1.0)

    wait_for(standby.acquire, 10, "the standby to take the lease of the frozen leader")

    assert standby.epoch == 2
    # its transaction was rolled back: ended by the standby, or by the server's idle timeout
    # first when this machine is slow (psycopg raises the two as different classes)
    with pytest.raises((OperationalError, InternalError), match="terminat"):
        frozen.execute(text("SELECT 1"))
    frozen.invalidate()
    with engine.connect() as c:
        assert not old.holds(c)
        assert c.scalar(select(Leader.holder)) == "standby"
    standby.release()


def test_a_leader_within_its_lease_keeps_it_while_a_transaction_locks_the_row(engine: Engine) -> None:
    leader = leader_lock(engine, "leader", lease_seconds=60.0)
    assert leader.acquire()
    busy = frozen_mid_transaction(engine, leader)
    standby = leader_lock(engine, "standby", lease_seconds=60.0)

    assert not standby.acquire()  # the row lock times out (1 s); the lease has not run out

    assert busy.execute(text("SELECT 1")).scalar() == 1  # the leader's session was left alone
    busy.commit()
    busy.close()
    assert leader.still_leader() and standby.epoch is None
    with engine.connect() as c:
        assert c.scalar(select(Leader.holder)) == "leader"


def test_the_lease_has_one_name_and_the_older_one_still_works_with_a_warning(engine: Engine) -> None:
    from airflow_quota.service.scheduler import QuotaService

    assert QuotaService(engine, {}, lease_seconds=3.0).lock.lease_seconds == 3.0
    with pytest.warns(DeprecationWarning, match="use lease_seconds"):
        older = QuotaService(engine, {}, leader_lease_seconds=4.0)
    assert older.lock.lease_seconds == 4.0
