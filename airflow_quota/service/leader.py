"""The quota scheduler process's loop and lease: lead when the lease allows, wait as a standby
otherwise, retry a pass that met a database error with back-off (never fatal), step down when the
lease is lost, and stop cleanly on SIGTERM.

What a leader does is its subclass's (``QuotaService``): ``recover`` on taking the lease, then
``step`` after ``step``; the hooks say what starts, stops and is forgotten with the leadership.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError, DisconnectionError, PendingRollbackError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session
from tenacity import RetryCallState, RetryError, Retrying, retry_if_exception_type, wait_exponential

from airflow_quota.service import snapshots
from airflow_quota.service.inbox import INBOX_SAFETY_SECONDS, RequestListener
from airflow_quota.service.wakeup import Wakeup
from airflow_quota.store.engine import DatabaseUnavailable, migrate, reachable
from airflow_quota.store.lock import LeaderLease, LeadershipLost, current_leader

log = logging.getLogger("airflow_quota.scheduler")

RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 5.0
RETRY_BACKOFF = wait_exponential(multiplier=RETRY_FIRST_SECONDS, max=RETRY_MAX_SECONDS)
"""Back-off after a database error: 0.5 s, doubling up to 5 s, reset by a pass that works."""

DATABASE_ERRORS = (DatabaseUnavailable, DBAPIError, PendingRollbackError, DisconnectionError, PoolTimeout)
"""What a dropped connection, a restarted or failed-over server looks like through SQLAlchemy."""


class _OneLine(logging.Filter):
    """SQLAlchemy's pool logs a connection it could not reset or close (the server dropped it)
    with a whole traceback; the scheduler has already logged the error in one line and retries,
    so the pool's record becomes one line too (a warning, with the driver's first line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            reason = database_error_line(record.exc_info[1])
            record.msg, record.args = f"{record.getMessage()}: {reason}", None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def database_error_line(exc: BaseException) -> str:
    """A database error in one readable line: its kind and the driver's first line."""
    if isinstance(exc, DatabaseUnavailable):
        return str(exc)
    orig = getattr(exc, "orig", None)
    source = orig if orig is not None else exc
    text = str(source).strip().splitlines()
    return f"{type(source).__name__}: {text[0] if text else '(no message)'}"


class LeaderLoop(ABC):
    """The loop of ``run`` and the lease it leads under.

    :param requests_announced: every client says when it has added a request
        (``request_added``), so a step outside ``run`` reads the inbox only then and every
        ``INBOX_SAFETY_SECONDS``, as ``run`` does on PostgreSQL after a notification.
    """

    def __init__(
        self, engine: Engine, holder: str, lock: LeaderLease, poll_seconds: float, requests_announced: bool
    ) -> None:
        self.engine = engine
        self.holder = holder
        self.lock = lock
        self.poll_seconds = poll_seconds
        self.requests_announced = requests_announced
        self._request_added = True
        """Whether a request may have come that the inbox was not read for since."""
        self._inbox_read_at = float("-inf")
        """When (``time.monotonic``) the leader last read its inbox."""
        self._listener: RequestListener | None = None
        """The connection that LISTENs for new requests while ``run`` leads on PostgreSQL."""
        self._fencing = False
        """True once ``run`` leads: then every decision transaction checks the lease's epoch."""
        self._leading = False
        """Whether ``run`` holds the leader lease (as far as it knows: the next check may say no)."""
        self._migrated = False
        """Whether ``run`` has brought the database's schema up to date."""
        self._standing_by = False
        """Whether ``run`` waits as a standby, having said so once in the log."""
        self._news = Wakeup()
        """Set when there is news to act on (a backend's, a request's, a stop): ends the idle wait."""
        self.cannot_lead: str | None = None
        """Why ``run`` stopped without leading (``RecoveryImpossible``); None otherwise."""
        if engine.dialect.name == "postgresql":
            _end_frozen_transactions(engine, lock.lease_seconds)

    # -- what a leader does: the subclass's --------------------------------------------------

    @abstractmethod
    def recover(self) -> None:
        """On taking the lease: rebuild the state from the committed log."""

    @abstractmethod
    def step(self) -> bool:
        """One pass of the leader; True when it had anything to do."""

    @abstractmethod
    def _starting(self) -> None:
        """``run`` begins: start what works beside the steps (threads, metrics)."""

    @abstractmethod
    def _stopping(self, leading: bool) -> None:
        """``run`` ends, still ``leading`` or not (the lease is released after)."""

    @abstractmethod
    def _forget(self) -> None:
        """The leadership is lost or in doubt: forget what is in memory (it may be ahead of what
        committed) and ask the backends about nothing until leading again."""

    @abstractmethod
    def _took_the_lease(self) -> None:
        """Just after taking the lease, before the first step: recovery and what follows it."""

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event, migrate_first: bool = True) -> None:
        """Lead when possible, wait otherwise, until ``stop`` is set (SIGTERM).

        The process is a loop of passes (``_pass``). A database error in a pass, the leader's
        or a standby's (at start or later: unreachable, connection dropped, server restarted),
        is logged in one line and the pass retried with back-off (``_retrying``), never fatal;
        a lost lease makes the leader step down and wait as a standby."""
        self._leading = False
        self._migrated = not migrate_first
        self._standing_by = False
        self._news.open()
        self._starting()
        self._fencing = True
        pool_log = getattr(self.engine.pool, "logger", None)  # sqlalchemy.pool.impl.QueuePool
        if isinstance(pool_log, logging.Logger) and not any(isinstance(f, _OneLine) for f in pool_log.filters):
            pool_log.addFilter(_OneLine())
        retrying = self._retrying(stop)
        while not stop.is_set():
            try:
                retrying(self._pass, stop)
            except LeadershipLost as exc:
                log.warning(
                    "%s lost the leadership (%s); what it had not committed is dropped; waiting", self.holder, exc
                )
                self._leading = False
                self._forget()
                self._stop_listening()
            except RetryError:
                break  # stopped while backing off from a database error
            except snapshots.RecoveryImpossible as exc:
                log.error("%s cannot lead: %s", self.holder, exc)
                self.cannot_lead = str(exc)
                self._forget()
                break
        self._stopping(self._leading)
        self._news.close()
        self._stop_listening()
        if self._leading:
            try:
                self.lock.release()
            except DATABASE_ERRORS as exc:
                log.warning(
                    "%s could not release the lease (%s): it runs out by itself", self.holder, database_error_line(exc)
                )
        log.info("%s stopped", self.holder)

    def _retrying(self, stop: threading.Event) -> Retrying:
        """How ``run`` retries a pass that met a database error (tenacity): after
        ``RETRY_BACKOFF``'s wait, cut short when ``stop`` is set, until it is. Each pass starts
        a fresh count, so one that works resets the back-off to its first wait."""

        def stopping(_: RetryCallState) -> bool:
            return stop.is_set()

        def pause(seconds: float) -> None:
            stop.wait(seconds)

        return Retrying(
            retry=retry_if_exception_type(DATABASE_ERRORS),
            wait=RETRY_BACKOFF,
            stop=stopping,
            sleep=pause,
            after=self._after_database_error,
        )

    def _after_database_error(self, attempt: RetryCallState) -> None:
        """A pass met a database error: say so in one line, and forget what is in memory (the
        scheduler may be ahead of what committed: rebuilt from the log once it leads again)."""
        assert attempt.outcome is not None  # tenacity calls ``after`` with the failed outcome
        error = attempt.outcome.exception()
        log.error(
            "%s (%s): database error: %s; retrying in %.1f s",
            self.holder,
            "leader" if self._leading else "standby",
            database_error_line(error) if error is not None else "?",
            RETRY_BACKOFF(attempt),
        )
        self._leading = False
        self._forget()
        self._stop_listening()
        self.lock.reset()
        self.engine.dispose()  # every pooled connection may be dead (server restart)

    def _pass(self, stop: threading.Event) -> None:
        """One pass of ``run``: migrate (once), take the lease or wait a moment as a standby,
        recover on taking it, then one step and, when it found nothing to do, a wait. Raises
        a database error for ``_retrying``, LeadershipLost when the lease is another's."""
        if stop.is_set():
            return  # stopped during a back-off
        with reachable(str(self.engine.url)):
            if not self._migrated:
                migrate(self.engine)
                self._migrated = True
            if not self._leading:
                self._leading = self.lock.acquire()
                if not self._leading:
                    if not self._standing_by:
                        log.info("%s waits as standby: %s leads", self.holder, current_leader(self.engine))
                        self._standing_by = True
                    stop.wait(min(1.0, self.lock.lease_seconds / 4))
                    return
                self._standing_by = False
                log.info(
                    "%s leads the quota scheduler (lease epoch %s, %g s lease)",
                    self.holder,
                    self.lock.epoch,
                    self.lock.lease_seconds,
                )
                self._took_the_lease()
            if not self.lock.still_leader():
                raise LeadershipLost(f"{self.holder}: another scheduler took the leader lease")
            self._listen()
            worked = self.step()
        if not worked:
            self._wait(stop)

    def _wait(self, stop: threading.Event) -> None:
        """Sleep until woken or the poll interval passes. What wakes it: a new request
        (PostgreSQL NOTIFY), a backend's news (the poller: an attempt's report changed, a start
        or stop came back), or ``wake`` (a stop)."""
        if stop.is_set():
            return
        self._news.wait(self.poll_seconds, also=None if self._listener is None else self._listener.fileno())

    def wake(self) -> None:
        """End the idle wait now: a stop asked for (safe in a signal handler)."""
        self._news.set()

    def request_added(self) -> None:
        """A client added a request (an in-process one, with ``requests_announced``; the listener
        hears the others): the next step reads the inbox, and an idle wait ends now."""
        self._request_added = True
        self._news.set()

    def _listen(self) -> None:
        """While leading on PostgreSQL, keep a connection LISTENing for new requests."""
        if self.engine.dialect.name != "postgresql":
            return
        if self._listener is None:
            url = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            self._listener = RequestListener(url)
            self._request_added = True  # what came before it listened
        self._listener.listen()

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _inbox_due(self) -> bool:
        """Whether this step reads the inbox (``service/inbox.py``): a request may have come
        (a notification, a client's word, a listener that cannot tell), or nobody would say
        so, or the safety interval has passed."""
        added, self._request_added = self._request_added, False
        if self._listener is not None:
            added = self._listener.heard() or added
        elif not self.requests_announced:
            return True
        return added or time.monotonic() - self._inbox_read_at >= INBOX_SAFETY_SECONDS

    def _fence(self, session: Session) -> None:
        """First thing in a transaction that commits decisions or backend outcomes: check (and
        renew) the lease under this process's epoch; raises ``LeadershipLost`` if it is gone."""
        if self._fencing:
            self.lock.fence(session.connection())


def _end_frozen_transactions(engine: Engine, lease_seconds: float) -> None:
    """PostgreSQL: the server ends a session of this scheduler that sits inside a transaction
    longer than a lease (``idle_in_transaction_session_timeout``). A leader frozen mid-transaction
    (SIGSTOP, a long pause) would otherwise hold the lease row's lock; its steps' transactions last
    milliseconds. The server does not end every such session (one idle after an ``executemany``):
    the standby ends those itself once the lease has run out (``LeaderLease._end_frozen_holder``)."""
    milliseconds = max(int(lease_seconds * 1000), 1000)

    @event.listens_for(engine, "connect")
    def _timeout(dbapi_connection: Any, _: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET idle_in_transaction_session_timeout = {milliseconds}")
        cursor.close()
        dbapi_connection.autocommit = autocommit


def run_forever(service: LeaderLoop) -> bool:
    """Run until SIGTERM or SIGINT, then stop cleanly (the lock is released for the next one);
    False when the scheduler stopped because it cannot lead (``cannot_lead``)."""
    import signal

    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("received %s: stopping after this step", signal.Signals(signum).name)
        stop.set()
        service.wake()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    service.run(stop)
    return service.cannot_lead is None
