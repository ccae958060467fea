"""Leader election: exactly one quota scheduler acts; the others wait.

PostgreSQL: a session-level advisory lock held on a dedicated connection. The server releases it
the moment the leader's connection dies, so a leader killed with SIGKILL is replaced at once.
SQLite: a lease row renewed every cycle; a dead leader's lease runs out after ``lease_seconds``.
Both record who leads in ``quota_leader`` for people to see.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from sqlalchemy import Connection, Engine, select, text, update
from sqlalchemy.exc import IntegrityError

from airflow_quota.store.engine import session_factory
from airflow_quota.store.models import Leader

ADVISORY_KEY = 0x41515554  # "AQUT": the quota scheduler's lock
LEADER = "scheduler"


class LeaderLock(Protocol):
    holder: str

    def acquire(self) -> bool:
        """Become the leader if nobody is; True when this process leads."""

    def still_leader(self) -> bool:
        """Renew the lease; False when leadership was lost (the caller must stop acting)."""

    def release(self) -> None: ...


def leader_lock(
    engine: Engine, holder: str, lease_seconds: float = 10.0, clock: Callable[[], float] = time.time
) -> LeaderLock:
    if engine.dialect.name == "postgresql":
        return AdvisoryLock(engine, holder, clock)
    return LeaseLock(engine, holder, lease_seconds, clock)


class AdvisoryLock:
    def __init__(self, engine: Engine, holder: str, clock: Callable[[], float]) -> None:
        self.engine = engine
        self.holder = holder
        self.clock = clock
        self._connection: Connection | None = None

    def acquire(self) -> bool:
        if self._connection is None:
            self._connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        got = bool(self._connection.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": ADVISORY_KEY}))
        if got:
            _record(self.engine, self.holder, self.clock() + 3600 * 24 * 365)
        return got

    def still_leader(self) -> bool:
        if self._connection is None:
            return False
        try:
            held = self._connection.scalar(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = :key "
                    "AND pid = pg_backend_pid() AND granted"
                ),
                {"key": ADVISORY_KEY},
            )
        except Exception:
            self._connection = None
            return False
        return bool(held)

    def release(self) -> None:
        if self._connection is not None:
            try:
                self._connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_KEY})
                self._connection.close()
            finally:
                self._connection = None


class LeaseLock:
    def __init__(self, engine: Engine, holder: str, lease_seconds: float, clock: Callable[[], float]) -> None:
        self.engine = engine
        self.holder = holder
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.sessions = session_factory(engine)

    def acquire(self) -> bool:
        now = self.clock()
        with self.sessions() as session, session.begin():
            row = session.scalars(select(Leader).where(Leader.name == LEADER)).first()
            if row is None:
                try:
                    with session.begin_nested():
                        session.add(Leader(name=LEADER, holder=self.holder, expires_at=now + self.lease_seconds))
                    return True
                except IntegrityError:
                    return False
            taken = session.execute(
                update(Leader)
                .where(Leader.name == LEADER)
                .where((Leader.holder == self.holder) | (Leader.expires_at < now))
                .values(holder=self.holder, expires_at=now + self.lease_seconds)
            )
            return bool(taken.rowcount)  # type: ignore[attr-defined]

    def still_leader(self) -> bool:
        return self.acquire()

    def release(self) -> None:
        with self.sessions() as session, session.begin():
            session.execute(
                update(Leader).where(Leader.name == LEADER, Leader.holder == self.holder).values(expires_at=0.0)
            )


def _record(engine: Engine, holder: str, expires_at: float) -> None:
    with session_factory(engine)() as session, session.begin():
        row = session.get(Leader, LEADER)
        if row is None:
            session.add(Leader(name=LEADER, holder=holder, expires_at=expires_at))
        else:
            row.holder, row.expires_at = holder, expires_at


def current_leader(engine: Engine) -> str | None:
    with session_factory(engine)() as session:
        row = session.get(Leader, LEADER)
        return None if row is None else row.holder
