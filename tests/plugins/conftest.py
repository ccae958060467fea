"""A real Airflow api-server with the Quotas plugin, and a quota database with the AWS
walkthrough played into it, for the API and browser tests.

Each module that needs one starts it once (``served`` in the module): an api-server costs
20-40 s to start here. The users are SimpleAuthManager's: ``viewer`` may read DAGs, ``editor``
(role ``user``) may also edit them, ``admin`` may do everything.

Airflow is told to keep its home in a temporary directory before anything imports it (the
in-process tests import Airflow's security module).
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-quota-plugin-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")

from urllib.parse import urlsplit

import httpx
from sqlalchemy import inspect, text

from airflow_quota.devtools.stack import AirflowStack, StackSettings
from airflow_quota.sim.scenario import Event
from airflow_quota.store.engine import make_engine
from airflow_quota.store.lock import leader_lock
from airflow_quota.store.models import Base
from airflow_quota.store.settings import normalize
from tests.conftest import ROOT
from tests.plugins.walkthrough import World, play

USERS = {"admin": "admin", "viewer": "viewer", "editor": "user"}
"""SimpleAuthManager users of the test Airflow, username to role."""

UNTIL = 7850.0
"""Where the walkthrough stops: after qs2-job's end (7800 s), when qs1-high borrows qs2's idle
instance, and before anything else ends (qs3-job at 8100 s). Shares then hold: qs1 two
instances (one borrowed), qs2 none (its instance lent), qs3 one; qs1-med waits; two
preemptions happened; qs1-med and qs1-high raised STARVING alerts (qs1-high's closed)."""


@dataclass
class Served:
    """The running api-server and the quota world behind it."""

    stack: AirflowStack
    world: World
    heartbeat: Heartbeat
    quota: dict[str, Any] | None = None
    """The quota the walkthrough was played with (None: the example's)."""

    @property
    def url(self) -> str:
        return self.stack.api_url

    def replay(
        self, quota: dict[str, Any] | None = None, events: list[Event] | None = None, until: float = UNTIL
    ) -> None:
        """Play the walkthrough again, as of now, into the emptied quota database (a fraction of
        a second): what an earlier test changed (a priority, the preemptions it caused, a
        stopped heartbeat) is gone, and the api-server, which keeps running, shows the state of
        ``UNTIL`` again. Given ``quota`` and ``events``, another story is played instead, up to
        ``until``: the next ``replay()`` plays the walkthrough again."""
        self.heartbeat.stop()
        self.heartbeat.lock.release()
        self.world.service.engine.dispose()
        empty(self.stack.quota_url)
        self.world = play(self.stack.quota_url, until, quota=quota or self.quota, events=events)
        self.heartbeat = Heartbeat(self.world.service.engine)
        self.heartbeat.start()

    def client(self, user: str | None = None, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """An HTTP client on the api-server, logged in as ``user`` (or with ``token``), or not."""
        if user is not None:
            token = self.stack.token(user)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.stack.api_url, headers=headers, timeout=60, **kwargs)


class Heartbeat:
    """The walkthrough's quota scheduler holding the leader lease and beating in a thread, as a
    running ``airflow-quota scheduler`` does (the walkthrough steps its service by hand): the
    page and the API see a scheduler running until :meth:`stop`."""

    def __init__(self, engine: Any, lease_seconds: float = 4.0) -> None:
        self.lock = leader_lock(engine, "walkthrough-scheduler", lease_seconds)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        assert self.lock.acquire(), "another scheduler holds the walkthrough's lease"
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(0.05):
            self.lock.still_leader()  # renews every quarter lease

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None


def serve(
    root: Path,
    quota: dict[str, Any] | None = None,
    quota_url: str | None = None,
    before_play: Callable[[str], None] | None = None,
) -> Iterator[Served]:
    """Start the api-server (with the walkthrough DAG in its DAGs folder) and play the
    walkthrough into its quota database (``quota_url``, else SQLite under ``root``), after
    ``before_play`` has had the migrated database's URL; stop everything afterwards."""
    settings = StackSettings(
        root=root,
        dags=[ROOT / "dags" / "quota_walkthrough.py"],
        users=USERS,
        components=("api-server",),
        quota_url=quota_url,
    )
    with AirflowStack(settings) as stack:
        if before_play is not None:
            before_play(stack.quota_url)
        world = play(stack.quota_url, UNTIL, quota=quota)
        heartbeat = Heartbeat(world.service.engine)
        heartbeat.start()
        served = Served(stack, world, heartbeat, quota)
        try:
            yield served
        finally:
            served.heartbeat.stop()
            served.world.service.engine.dispose()


def empty(url: str) -> None:
    """Delete every row of the quota database's tables (the schema and its revision stay), and
    restart SQLite's ids, so a walkthrough played again gets the same job ids."""
    engine = make_engine(normalize(url))
    try:
        with engine.begin() as connection:
            for table in reversed(Base.metadata.sorted_tables):
                connection.execute(table.delete())
            if engine.dialect.name == "sqlite" and inspect(connection).has_table("sqlite_sequence"):
                connection.execute(text("DELETE FROM sqlite_sequence"))
    finally:
        engine.dispose()


@dataclass
class RawAnswer:
    """What a raw HTTP request got back, and when."""

    status: int
    head: str
    seconds: float
    """From the request's headers being sent to the answer's status line arriving."""
    body_sent: int
    """Bytes of the body the client had handed to the network when the answer arrived."""


def raw_request(
    url: str,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes = b"",
    content_length: int | None = None,
    timeout: float = 20.0,
) -> RawAnswer:
    """Send a request on a plain socket: the headers (``Content-Length`` is ``content_length``,
    by default the body's length), then the body from a second thread while this one waits
    for the status line. A server that answers before reading the body answers even when the
    body never comes (``content_length`` larger than ``body``); one that reads it first makes
    this wait ``timeout`` and fail."""
    target = urlsplit(url)
    assert target.hostname is not None and target.port is not None
    declared = len(body) if content_length is None else content_length
    lines = [f"{method} {path} HTTP/1.1", f"Host: {target.netloc}", f"Content-Length: {declared}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    sent = 0
    with socket.create_connection((target.hostname, target.port), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        started = time.monotonic()

        def send_body() -> None:
            nonlocal sent
            view = memoryview(body)
            try:
                while sent < len(body):
                    sent += sock.send(view[sent : sent + 65536])
            except OSError:  # the server answered and closed, or the socket was shut
                pass

        sender = threading.Thread(target=send_body, daemon=True)
        sender.start()
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        seconds, body_sent = time.monotonic() - started, sent
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sender.join(timeout)
    head = received.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    assert head.startswith("HTTP/1.1 "), f"no HTTP answer: {received[:200]!r}"
    return RawAnswer(int(head.split(" ", 2)[1]), head, seconds, body_sent)
