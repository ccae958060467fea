"""Leader election: exactly one quota scheduler acts; the others wait.

Leadership is a *lease* in the row ``quota_leader(name, holder, epoch, expires_at, holder_pid)``,
the same on PostgreSQL and SQLite:

- the leader renews it (its heartbeat) every step, to ``now + lease_seconds``;
- a standby takes it when it has run out (the leader stopped beating: killed, frozen by SIGSTOP,
  a long pause), or at once on PostgreSQL when the leader's lease connection is gone from
  ``pg_stat_activity`` (the leader died: failover in a second or two, not a whole lease);
- every takeover adds one to ``epoch``. The leader's decision transactions run :meth:`fence`,
  an ``UPDATE ... WHERE holder = me AND epoch = my epoch``: when it matches no row, another
  scheduler took over, the transaction is rolled back and the stale leader steps down. So a
  leader frozen past its lease and then resumed commits nothing.

All times are the database's clock (``clock_timestamp()`` on PostgreSQL, ``julianday('now')``
on SQLite, which is embedded and so shares the host's clock), never the schedulers' own, so
clocks that disagree between hosts cannot make two leaders.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from airflow_quota.store.engine import session_factory
from airflow_quota.store.models import Leader

LEADER = "scheduler"

log = logging.getLogger("airflow_quota.scheduler")


class LeadershipLost(Exception):
    """Another scheduler holds the lease now (a newer epoch): stop acting and roll back."""


def _now_sql(dialect: str) -> str:
    """The database clock in epoch seconds, as an SQL expression."""
    if dialect == "postgresql":
        return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
    return "((julianday('now') - 2440587.5) * 86400.0)"


class LeaderLease:
    """The lease of one scheduler process (``holder``), with its fencing epoch once it leads.

    On PostgreSQL it keeps one dedicated connection for the lease, whose backend pid is recorded
    in the row: while it is open, standbys wait for the lease to run out; when it closes (the
    process died), they take over at once. After any database error the caller calls
    :meth:`reset`, which discards that connection (a broken one cannot be rolled back).
    """

    @property
    def beat_seconds(self) -> float:
        """How often the leader renews the lease (``still_leader``): its heartbeat interval."""
        return self.lease_seconds / 4

    def __init__(self, engine: Engine, holder: str, lease_seconds: float = 10.0, backends: Sequence[str] = ()) -> None:
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds}")
        self.engine = engine
        self.holder = holder
        self.lease_seconds = float(lease_seconds)
        self.backends = ",".join(sorted(backends))
        """The backends this scheduler runs, written with the lease for readers (``doctor``)."""
        self.dialect = engine.dialect.name
        self.now = _now_sql(self.dialect)
        self.epoch: int | None = None
        """The epoch this process leads under; None while it does not lead."""
        self._connection: Connection | None = None
        self._renewed = float("-inf")
        self.beats = 0
        """Lease renewals by this process: the ``quota.scheduler.heartbeat`` counter."""
        """When (``time.monotonic``) the lease was last taken or renewed by this process."""

    # -- connections ---------------------------------------------------------------------

    def _conn(self) -> Connection:
        """The lease connection: dedicated on PostgreSQL (its pid is the holder's liveness), a
        fresh pooled one on SQLite (a file lock has no liveness to offer)."""
        if self._connection is None:
            connection = self.engine.connect()
            if self.dialect == "postgresql":
                # each lease statement is one atomic UPDATE: no BEGIN/COMMIT round trips; a frozen
                # leader may hold the row lock in its decision transaction: never queue behind it
                # for long (idle_in_transaction_session_timeout ends that transaction)
                connection = connection.execution_options(isolation_level="AUTOCOMMIT")
                connection.exec_driver_sql("SET lock_timeout = '1s'")
                connection.commit()  # ends SQLAlchemy's autobegun (no-op) transaction
            self._connection = connection
        return self._connection

    def _done(self) -> None:
        if self.dialect != "postgresql" and self._connection is not None:
            self._connection.close()
            self._connection = None

    def reset(self) -> None:
        """Forget the lease connection after a database error: it is invalidated (not returned
        to the pool), and the next call opens a new one. The epoch is kept: when this process
        still holds the lease, it may take it again as itself."""
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.invalidate()
                connection.close()
            except Exception as exc:  # the connection is already broken: nothing to clean up
                log.debug("discarding the lease connection: %s", exc)

    # -- the lease -----------------------------------------------------------------------

    def acquire(self, retry_after_ending_frozen: bool = True) -> bool:
        """Take the lease when it is free, has run out, its holder's connection is gone, or this
        process holds it; True (and a new epoch) when this process now leads.

        A lease that has run out while a transaction of its holder still locks the row (a
        leader frozen mid-transaction: SIGSTOP, a stalled VM) is taken by ending that session
        (:meth:`_end_frozen_holder`), then trying once more."""
        connection = self._conn()
        pid = "pg_backend_pid()" if self.dialect == "postgresql" else "NULL"
        dead_holder = (
            " OR (holder_pid IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = holder_pid))"
            if self.dialect == "postgresql"
            else ""
        )
        try:
            with connection.begin():
                params: dict[str, Any] = {
                    "name": LEADER,
                    "me": self.holder,
                    "lease": self.lease_seconds,
                    "beat": self.beat_seconds,
                    "backends": self.backends,
                }
                epoch = connection.scalar(
                    text(
                        f"UPDATE quota_leader SET holder = :me, epoch = epoch + 1, "
                        f"expires_at = {self.now} + :lease, holder_pid = {pid}, "
                        f"heartbeat_at = {self.now}, heartbeat_seconds = :beat, backends = :backends "
                        f"WHERE name = :name AND (expires_at < {self.now} OR holder = :me{dead_holder}) "
                        "RETURNING epoch"
                    ),
                    params,
                )
                if epoch is None:
                    exists = connection.execute(
                        text("SELECT 1 FROM quota_leader WHERE name = :name"), {"name": LEADER}
                    ).first()
                    if exists is None:
                        connection.execute(
                            text(
                                "INSERT INTO quota_leader (name, holder, epoch, expires_at, holder_pid, "
                                "heartbeat_at, heartbeat_seconds, backends) "
                                f"VALUES (:name, :me, 1, {self.now} + :lease, {pid}, {self.now}, :beat, :backends)"
                            ),
                            params,
                        )
                        epoch = 1
        except IntegrityError:  # another scheduler inserted the row first: it leads
            self._done()
            return False
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != "55P03":
                raise
            # lock_timeout: a transaction holds the row. Its holder is frozen when the lease it
            # last committed has run out: end that session and try once more
            if retry_after_ending_frozen and self._end_frozen_holder(connection):
                return self.acquire(retry_after_ending_frozen=False)
            self._done()
            return False
        self._done()
        self.epoch = None if epoch is None else int(epoch)
        if self.epoch is not None:
            self._renewed = time.monotonic()
        return self.epoch is not None

    def _end_frozen_holder(self, connection: Connection) -> bool:
        """PostgreSQL: end the session whose open transaction locks the lease row, if the lease
        it last committed has run out; whether one was ended. Its transaction is rolled back,
        so a frozen leader that resumes commits nothing and steps down.

        ``idle_in_transaction_session_timeout`` cannot do this alone: a session left idle in
        its transaction after an ``executemany`` (psycopg runs one as a pipeline) is not ended
        by it (PostgreSQL 15, psycopg 3.3; ``tests/service/test_leader_lease.py``), nor is one
        frozen halfway through sending a statement. The session is found by the transaction id
        in the row's ``xmax`` (the locker's) in ``pg_locks`` (each transaction locks its own)."""
        try:
            with connection.begin():
                ended = connection.execute(
                    text(
                        "SELECT l.pid, pg_terminate_backend(l.pid, 1000) FROM quota_leader q "
                        "JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = q.xmax AND l.granted "
                        f"WHERE q.name = :name AND q.expires_at < {self.now} AND l.pid <> pg_backend_pid()"
                    ),
                    {"name": LEADER},
                ).all()
        except DBAPIError as exc:  # not allowed to end another role's session: wait for the timeout
            log.warning("%s cannot end the frozen leader's session: %s", self.holder, exc.orig)
            return False
        for pid, done in ended:
            log.warning(
                "%s ended session %s: it locks the leader lease, which ran out (a leader frozen mid-transaction)%s",
                self.holder,
                pid,
                "" if done else "; it has not exited yet",
            )
        return any(done for _, done in ended)

    def still_leader(self) -> bool:
        """The heartbeat: renew the lease to now + ``lease_seconds``; False when another
        scheduler has taken it (this process must stop acting). Renewed at most every quarter
        lease (each decision transaction renews it too): a busy loop does not load the database,
        and a process frozen longer than that renews (or learns it lost the lease) on waking."""
        if self.epoch is None:
            return False
        if time.monotonic() - self._renewed < self.lease_seconds / 4:
            return True
        connection = self._conn()
        with connection.begin():
            renewed = self._renew(connection)
        self._done()
        if not renewed:
            self.epoch = None
        return renewed

    def fence(self, connection: Connection) -> None:
        """Inside a decision transaction: renew the lease only if this process still holds it
        under its epoch, else raise :class:`LeadershipLost` (the caller rolls back). The row
        stays locked until that transaction ends, so a takeover waits for it or wins before it."""
        if self.epoch is None or not self._renew(connection):
            held = self.epoch
            self.epoch = None
            raise LeadershipLost(f"{self.holder} no longer holds the leader lease (its epoch was {held})")

    def holds(self, connection: Connection) -> bool:
        """Whether this process holds the lease now, under its epoch and not run out (in the
        database's clock): a read, so it never waits on the leader's own transactions that hold
        the lease row. What the poller's threads check just before each start or stop; the
        transactions that commit still :meth:`fence`."""
        if self.epoch is None:
            return False
        row = connection.execute(
            text(
                "SELECT 1 FROM quota_leader WHERE name = :name AND holder = :me AND epoch = :epoch "
                f"AND expires_at > {self.now}"
            ),
            {"name": LEADER, "me": self.holder, "epoch": self.epoch},
        ).first()
        return row is not None

    def _renew(self, connection: Connection) -> bool:
        done = connection.execute(
            text(
                f"UPDATE quota_leader SET expires_at = {self.now} + :lease, heartbeat_at = {self.now} "
                "WHERE name = :name AND holder = :me AND epoch = :epoch"
            ),
            {"lease": self.lease_seconds, "name": LEADER, "me": self.holder, "epoch": self.epoch},
        )
        if done.rowcount:
            self._renewed = time.monotonic()
            self.beats += 1
        return bool(done.rowcount)

    def release(self) -> None:
        """Give the lease up (a clean stop): the next standby takes it at once."""
        if self.epoch is not None:
            connection = self._conn()
            with connection.begin():
                connection.execute(
                    text(
                        "UPDATE quota_leader SET expires_at = 0, holder_pid = NULL "
                        "WHERE name = :name AND holder = :me AND epoch = :epoch"
                    ),
                    {"name": LEADER, "me": self.holder, "epoch": self.epoch},
                )
            self.epoch = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def leader_lock(engine: Engine, holder: str, lease_seconds: float = 10.0, backends: Sequence[str] = ()) -> LeaderLease:
    """The lease for the scheduler ``holder`` (running ``backends``) on ``engine``'s database."""
    return LeaderLease(engine, holder, lease_seconds, backends)


@dataclass(frozen=True, slots=True)
class SchedulerHealth:
    """Whether a quota scheduler leads: who last did, how long ago it beat, how often it should."""

    leader: str | None
    silent_seconds: float | None
    """Seconds since the last heartbeat (None: no scheduler has ever led here)."""
    heartbeat_seconds: float | None
    lease_left_seconds: float | None = None
    """Seconds until the lease runs out (negative: it has; a clean stop sets it to run out at once)."""
    backends: tuple[str, ...] | None = None
    """The backends the holder runs (None: not recorded, a scheduler from before they were)."""

    @property
    def down(self) -> bool:
        """No leader has beaten for 3x its interval (or none ever led): waiting jobs wait on nothing."""
        if self.silent_seconds is None or self.heartbeat_seconds is None:
            return True
        return self.silent_seconds > MISSED_BEATS * self.heartbeat_seconds


MISSED_BEATS = 3
"""Heartbeats a leader may miss before readers say no quota scheduler runs."""


def scheduler_health(engine: Engine) -> SchedulerHealth:
    """The leader row read against the database's own clock (the one the heartbeat is written in)."""
    now = _now_sql(engine.dialect.name)
    with engine.connect() as connection:
        row = connection.execute(
            text(
                f"SELECT holder, {now} - heartbeat_at, heartbeat_seconds, expires_at - {now}, backends "
                "FROM quota_leader WHERE name = :name"
            ),
            {"name": LEADER},
        ).first()
    if row is None:
        return SchedulerHealth(None, None, None)
    holder, silent, interval, left, backends = row
    return SchedulerHealth(
        holder,
        None if silent is None else max(0.0, float(silent)),
        interval,
        None if left is None else float(left),
        None if backends is None else tuple(name for name in backends.split(",") if name),
    )


def current_leader(engine: Engine) -> str | None:
    """Who holds (or last held) the lease, for display."""
    with session_factory(engine)() as session:
        row = session.get(Leader, LEADER)
        return None if row is None else row.holder
