"""The leader reads its inbox of requests when someone says one came (``service/inbox.py``): a
PostgreSQL notification heard by its listener, or an in-process client's word
(``requests_announced``), besides a read every ``INBOX_SAFETY_SECONDS``; without either, at
every step. A step that has nothing to read asks the database nothing about requests."""

from __future__ import annotations

import selectors
from contextlib import AbstractContextManager
from typing import Any

import pytest
from sqlalchemy import Engine, select

from airflow_quota.service import leader as leader_module
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.inbox import RequestListener
from airflow_quota.service.intake import REQUESTS_PER_STEP
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import session_factory
from airflow_quota.store.models import Request
from airflow_quota.store.repository import QuotaStore
from tests.builders import request
from tests.statements import statements_run

QUOTA = {
    "pool": {"capacity": {"ml.g5.xlarge": 1}},
    "shares": [{"name": "team", "capacity_limits": {"ml.g5.xlarge": 1}}],
}


def leader(engine: Engine, **options: Any) -> tuple[QuotaService, QuotaStore]:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock, **options)
    service.recover()
    service.step()  # the configuration taken in: the first step always reads
    return service, store


def unhandled(engine: Engine) -> int:
    with session_factory(engine)() as session:
        return len(session.scalars(select(Request.id).where(Request.handled.is_(False))).all())


def inbox_reads(engine: Engine) -> AbstractContextManager[list[str]]:
    """The statements that read the inbox while the block runs."""
    return statements_run(
        engine,
        lambda statement: (
            statement.startswith("SELECT quota_requests.id") and "WHERE quota_requests.handled IS false" in statement
        ),
    )


def test_without_anyone_to_say_so_every_step_reads_the_inbox(engine: Engine) -> None:
    service, _ = leader(engine)
    with inbox_reads(engine) as reads:
        service.step()
        service.step()
    assert len(reads) == 2


def test_a_leader_told_of_requests_reads_its_inbox_only_then(engine: Engine) -> None:
    service, store = leader(engine, requests_announced=True)
    store.submit(request("quiet", "team"), "fake", {"duration": 600})
    with inbox_reads(engine) as reads:
        service.step()
    assert reads == [] and unhandled(engine) == 1, "read the inbox though nobody said a request came"

    service.request_added()
    with inbox_reads(engine) as reads:
        service.step()
        service.step()  # nothing said since: not read again
    assert len(reads) == 1 and unhandled(engine) == 0


def test_the_safety_read_takes_in_a_request_nobody_announced(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    service, store = leader(engine, requests_announced=True)
    store.submit(request("unannounced", "team"), "fake", {"duration": 600})
    service.step()
    assert unhandled(engine) == 1
    monkeypatch.setattr(leader_module, "INBOX_SAFETY_SECONDS", 0.0)
    service.step()
    assert unhandled(engine) == 0


def test_a_full_page_of_requests_is_read_on_at_the_next_step(engine: Engine) -> None:
    service, store = leader(engine, requests_announced=True)
    for index in range(REQUESTS_PER_STEP + 5):
        store.submit(request(f"job-{index}", "team"), "fake", {"duration": 600})
    service.request_added()
    service.step()
    assert unhandled(engine) == 5
    service.step()  # no word since, but the last read was a full page
    assert unhandled(engine) == 0


@pytest.fixture
def db_url(postgres_url: str) -> str:
    """PostgreSQL only: LISTEN and NOTIFY are PostgreSQL's."""
    return postgres_url


def readable(listener: RequestListener, timeout: float = 10.0) -> bool:
    """Wait until the listener's connection has something to read (a notification), or not."""
    fileno = listener.fileno()
    assert fileno is not None
    with selectors.DefaultSelector() as selector:
        selector.register(fileno, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def test_the_listener_hears_each_request_once_it_is_committed(engine: Engine, postgres_url: str) -> None:
    listener = RequestListener(postgres_url)
    listener.listen()
    try:
        assert listener.listening
        assert not listener.heard()
        store = QuotaStore(engine)
        store.apply_config(QUOTA)
        assert readable(listener), "no notification arrived"
        assert listener.heard()
        assert not listener.heard(), "the same notification heard twice"
    finally:
        listener.close()
    assert listener.heard(), "a listener that is not listening cannot say no request came"


def test_a_leader_listening_on_postgresql_reads_its_inbox_after_a_notification(engine: Engine) -> None:
    service, store = leader(engine)
    service._listen()  # as ``run`` does once it leads
    try:
        assert service._listener is not None and service._listener.listening
        service.step()  # what came before it listened
        with inbox_reads(engine) as reads:
            service.step()
        assert reads == [], "read the inbox with no notification"

        store.submit(request("heard", "team"), "fake", {"duration": 600})
        assert readable(service._listener)
        with inbox_reads(engine) as reads:
            service.step()
        assert len(reads) == 1 and unhandled(engine) == 0
    finally:
        service._stop_listening()
