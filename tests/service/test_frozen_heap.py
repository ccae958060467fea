"""The scheduler process freezes what lives long (``gc.freeze``) after recovery and after each
snapshot, so no garbage collection walks the modules and the core's state again (a full
collection walks every object it sees: 60-80 ms for the imports alone, in whatever step or prune
batch triggers it). A service driven step by step (tests, the replay benchmarks) freezes nothing.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, func, select

from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import Snapshot
from airflow_quota.store.repository import QuotaStore
from tests.builders import request
from tests.waiting import wait_for

QUOTA = {
    "pool": {"capacity": {"ml.g5.xlarge": 2}},
    "shares": [{"name": "team", "capacity_limits": {"ml.g5.xlarge": 2}}],
}


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    migrate(engine)
    QuotaStore(engine).apply_config(QUOTA)
    gc.unfreeze()  # the test process's own, if any
    yield engine
    gc.unfreeze()  # what a test froze goes back to the collector
    engine.dispose()


def snapshots(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(Snapshot)) or 0)


def test_the_scheduler_process_freezes_its_heap_after_recovery_and_each_snapshot(engine: Engine) -> None:
    service = QuotaService(engine, {"fake": FakeBackend(time.time)}, snapshot_every=2, poll_seconds=0.05)
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,))
    runner.start()
    try:
        wait_for(lambda: service.recovered, 30, "the scheduler to lead and recover")
        wait_for(lambda: gc.get_freeze_count() > 0, 10, "the heap frozen after recovery")
        after_recovery = gc.get_freeze_count()
        store = QuotaStore(engine)
        for name in ("a", "b", "c"):
            store.submit(request(name, "team"), "fake", {"duration": 60})
        wait_for(lambda: snapshots(engine) > 0, 30, "a snapshot after two inputs")
        wait_for(lambda: gc.get_freeze_count() > after_recovery, 10, "what came since frozen after the snapshot")
    finally:
        stop.set()
        service.wake()
        runner.join(timeout=60)
    assert not runner.is_alive()


def test_a_service_driven_step_by_step_freezes_nothing(engine: Engine) -> None:
    service = QuotaService(engine, {"fake": FakeBackend(time.time)}, snapshot_every=1)
    service.recover()
    QuotaStore(engine).submit(request("a", "team"), "fake", {"duration": 60})
    service.step()
    assert snapshots(engine) > 0
    assert gc.get_freeze_count() == 0
