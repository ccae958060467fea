"""A real quota world for the Airflow layer's tests: a SQLite quota database with a
configuration applied, the real ``QuotaService`` with the fake backend (also standing in for
``local``) on a manual clock, and the Airflow connection ``quota_default`` pointing at it.

Airflow is told to keep its home in a temporary directory before it is first imported.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-quota-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")

import pytest
from airflow.triggers.base import TriggerEvent
from sqlalchemy import Engine

from airflow_quota.core.model import JobRequest
from airflow_quota.service.backends.base import Backend
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import JobRow
from airflow_quota.store.repository import QuotaStore
from tests.moto_server import moto_url

__all__ = ["moto_url"]  # the fixture, shared from tests/moto_server.py

QUOTA: dict[str, Any] = {
    "pool": {"capacity": {"ml.g5.xlarge": 2, "ml.c5.xlarge": 1}},
    "shares": [
        {
            "name": "research",
            "capacity_limits": {"ml.g5.xlarge": 1, "ml.c5.xlarge": 1},
            "strategy": "LEND_AND_BORROW",
            "max_priority": 50,
        },
        {"name": "prod", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "LEND"},
    ],
}
"""Two g5 instances, one per share: research may borrow prod's when prod is idle."""

G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]


def request(name: str, share: str = "research", priority: int = 1, **fields: Any) -> JobRequest:
    return JobRequest(name=name, share=share, priority=priority, preferences=fields.pop("preferences", G5), **fields)


@dataclass
class QuotaWorld:
    """The quota database, its scheduler and its clock, driven by hand."""

    url: str
    engine: Engine
    clock: ManualClock
    store: QuotaStore
    service: QuotaService
    fake: FakeBackend
    steps: int = field(default=0)

    def step(self, at: float | None = None) -> None:
        """One pass of the quota scheduler, after moving the clock to ``at``."""
        if at is not None:
            self.clock.advance_to(at)
        self.service.step()
        self.steps += 1

    def submit(self, name: str, training: dict[str, Any] | None = None, **fields: Any) -> JobRow:
        return self.store.submit(request(name, **fields), "fake", training or {"duration": 100})

    def job(self, job_id: int) -> JobRow:
        row = self.store.job(job_id)
        assert row is not None
        return row


@contextmanager
def quota_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backends: Mapping[str, Backend] | None = None
) -> Iterator[QuotaWorld]:
    """A quota world whose scheduler runs the fake backend as ``fake`` and, unless ``backends``
    names them otherwise, as ``local``."""
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    engine = make_engine(url)
    migrate(engine)
    clock = ManualClock(1_000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    fake = FakeBackend(clock.now)
    service = QuotaService(
        engine, {"fake": fake, "local": fake, **(backends or {})}, clock=clock, refresh_views_seconds=0.0
    )
    service.step()  # the scheduler takes the configuration in and writes its first view
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_DEFAULT", url)
    try:
        yield QuotaWorld(url, engine, clock, store, service, fake)
    finally:
        engine.dispose()


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[QuotaWorld]:
    with quota_world(tmp_path, monkeypatch) as made:
        yield made


async def events_of(run: AsyncIterator[TriggerEvent], timeout: float = 10.0) -> list[TriggerEvent]:
    """Every event a trigger's ``run()`` yields before it returns (bounded in time)."""

    async def collect() -> list[TriggerEvent]:
        return [event async for event in run]

    return await asyncio.wait_for(collect(), timeout)


def payload_of(event: TriggerEvent) -> dict[str, Any]:
    """A trigger event's payload, which the quota triggers make a dict."""
    payload = event.payload
    assert isinstance(payload, dict)
    return payload
