"""The quota scheduler's heartbeat (issue 16): readers can tell that no scheduler runs, in the
database's own clock, and the leader counts its beats in ``quota.scheduler.heartbeat``."""

from __future__ import annotations

from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.metrics import QuotaMetrics
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.lock import MISSED_BEATS, leader_lock
from airflow_quota.store.repository import QuotaStore
from tests.builders import quota, share
from tests.service.stats_recording import Recording
from tests.waiting import wait_for


def test_no_scheduler_then_a_beating_leader_then_a_silent_one(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    store = QuotaStore(engine)
    never = store.scheduler_health()
    assert never.down and never.leader is None and never.silent_seconds is None
    lease = leader_lock(engine, "scheduler-a", lease_seconds=0.2)
    assert lease.acquire()
    beating = store.scheduler_health()
    assert not beating.down and beating.leader == "scheduler-a"
    assert beating.heartbeat_seconds == 0.05 and beating.silent_seconds is not None
    # the leader stops beating: down after 3 beats
    wait_for(lambda: store.scheduler_health().down, 30, "the silent leader to show as down", interval=0.01)
    silent = store.scheduler_health()
    assert silent.silent_seconds is not None and silent.silent_seconds > MISSED_BEATS * 0.05
    assert lease.still_leader()  # it beats again (its lease was free to take back)
    assert not store.scheduler_health().down
    engine.dispose()


def test_the_leader_counts_its_heartbeats(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    backend = Recording()
    clock = ManualClock(1_000_000.0)
    QuotaStore(engine, clock.now).apply_config(quota({"ml.g5.xlarge": 1}, share("team", {"ml.g5.xlarge": 1})))
    service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock, metrics=QuotaMetrics(backend))
    service.step()  # the configuration
    assert service.lock.acquire()
    service.lock._renewed = float("-inf")  # a quarter lease has passed: the next check renews
    assert service.lock.still_leader()
    service.step()
    service.step()  # no new beat: nothing more to count
    assert [c for c in backend.calls if c[1] == "quota.scheduler.heartbeat"] == [
        ("incr", "quota.scheduler.heartbeat", 1, None)
    ]
    engine.dispose()
