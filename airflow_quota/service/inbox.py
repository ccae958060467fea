"""When the leader reads its inbox of requests (``quota_requests``): when someone said a request
came, not at every step.

Every request a client adds (a submission, a cancel, a priority change, a configuration, the
provider's capacity) is written through ``QuotaStore``, which sends ``NOTIFY airflow_quota`` in
the same transaction: PostgreSQL delivers it once the request is committed, never before. A
leader on PostgreSQL keeps one connection of its own LISTENing (:class:`RequestListener`) while
it leads and reads the inbox only at a step after a notification, besides once every
``INBOX_SAFETY_SECONDS`` in case one was missed (a connection that died without saying so).
Its idle wait wakes on that connection as well, so a request is taken in as soon as it lands.

Without a listener (SQLite has no notifications; ``step`` driven by tests) the inbox is read at
every step, unless the clients said they announce each request themselves (the replays, whose
client runs in the same process: ``QuotaService.request_added``).
"""

from __future__ import annotations

import contextlib
import logging
import time

import psycopg

from airflow_quota.store.repository import NOTIFY_CHANNEL

log = logging.getLogger("airflow_quota.scheduler")

INBOX_SAFETY_SECONDS = 5.0
"""A leader that only reads its inbox when told reads it at least this often (wall-clock seconds)."""
RECONNECT_SECONDS = 1.0
"""A listener that could not connect tries again at most this often."""


class RequestListener:
    """A connection of its own that LISTENs for new requests on PostgreSQL.

    :param url: a libpq URL of the quota database.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: psycopg.Connection | None = None
        self._tried_at = float("-inf")

    @property
    def listening(self) -> bool:
        return self._connection is not None

    def listen(self) -> None:
        """Connect and LISTEN, unless already listening or tried less than a second ago. A
        failure leaves it closed (``heard`` then says yes at every step) and is logged once."""
        if self._connection is not None or time.monotonic() - self._tried_at < RECONNECT_SECONDS:
            return
        self._tried_at = time.monotonic()
        try:
            connection = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            connection.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except psycopg.Error as exc:
            log.warning("cannot listen for new requests (%s): the inbox is read at every step", exc)
            return
        self._connection = connection

    def heard(self) -> bool:
        """Whether a request may have come since the last call: a notification arrived, or the
        listener is not listening (it cannot say no). Never waits."""
        if self._connection is None:
            return True
        try:
            return bool(list(self._connection.notifies(timeout=0)))  # all of them: each says the same
        except psycopg.Error as exc:
            log.warning("stopped listening for new requests (%s): reconnecting", exc)
            self.close()
            return True

    def fileno(self) -> int | None:
        """The connection's socket, for the idle wait's ``select``; None when not listening."""
        if self._connection is None:
            return None
        try:
            return self._connection.fileno()
        except psycopg.Error:
            return None

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(psycopg.Error):  # closing a dead connection: nothing to do
                connection.close()
