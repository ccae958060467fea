"""``view_seconds``: while steps follow one another the shares' view is rewritten at most that
often (the scheduler process: once a second), and the first step that finds nothing to do
writes it, so readers see it exact once a burst is over; with 0 every commit writes it."""

from __future__ import annotations

from sqlalchemy import Engine

from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import session_factory
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.views import read_view
from tests.builders import request

QUOTA = {
    "pool": {"capacity": {"ml.g5.xlarge": 1}},
    "shares": [{"name": "team", "capacity_limits": {"ml.g5.xlarge": 1}}],
}


def waiting(engine: Engine) -> tuple[int, int]:
    """The stored view's running and runnable jobs of the share."""
    with session_factory(engine)() as session:
        share = read_view(session).share("team")
    assert share is not None
    return share.running, share.runnable


def leader(engine: Engine, view_seconds: float) -> tuple[QuotaService, QuotaStore, ManualClock]:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock, view_seconds=view_seconds)
    service.recover()
    service.step()  # the configuration taken in
    return service, store, clock


def test_a_busy_leader_leaves_the_view_behind_and_writes_it_when_idle(engine: Engine) -> None:
    service, store, clock = leader(engine, view_seconds=3600.0)  # nothing but idleness writes it again
    before = waiting(engine)
    for name in ("a", "b", "c"):
        store.submit(request(name, "team"), "fake", {"duration": 600})
    clock.advance_to(1001.0)
    assert service.step()  # took them in, placed one: busy
    assert waiting(engine) == before, "a busy step rewrote the view within view_seconds"

    clock.advance_to(1002.0)
    while service.step():  # the starts marked done
        clock.advance_to(clock.now() + 1.0)

    assert waiting(engine) == (1, 2)


def test_with_view_seconds_0_every_commit_writes_the_view(engine: Engine) -> None:
    service, store, clock = leader(engine, view_seconds=0.0)
    for name in ("a", "b", "c"):
        store.submit(request(name, "team"), "fake", {"duration": 600})
    clock.advance_to(1001.0)
    assert service.step()
    assert waiting(engine) == (1, 2)
