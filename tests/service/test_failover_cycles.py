"""Cycle counting survives a failover: GUARANTEE_VIOLATED needs a guarantee unmet for two cycles,
and a cycle that decided nothing but started that count is logged, so a new leader that takes
over between the two cycles raises the alert at the same cycle the old leader would have."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from airflow_quota.core.index import fast as phases
from airflow_quota.core.model import JobRequest
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import Input
from airflow_quota.store.repository import QuotaStore
from tests.builders import quota, share

G5 = "ml.g5.xlarge"


def _leader(engine: Any, clock: ManualClock) -> QuotaService:
    service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock, cycle_seconds=1.0)
    service.recover()
    return service


def _cycles_logged(store: QuotaStore) -> int:
    with store.sessions() as session:
        return len(session.scalars(select(Input.id).where(Input.kind == "cycle")).all())


@pytest.mark.parametrize("failover", [False, True], ids=["one leader", "a failover between the two cycles"])
def test_a_new_leader_counts_the_watchdogs_cycles(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, failover: bool
) -> None:
    # a fault in the core: the index offers no candidate, so a job that fits under its limit waits
    monkeypatch.setattr(phases, "within_quota", lambda *args, **kwargs: iter(()))
    monkeypatch.setattr(phases, "borrowing", lambda *args, **kwargs: iter(()))
    monkeypatch.setattr(phases, "preemption", lambda *args, **kwargs: iter(()))
    engine = make_engine(sqlite_url)
    migrate(engine)
    clock = ManualClock(1_000_000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(quota({G5: 2}, share("team", {G5: 2})))
    leader = _leader(engine, clock)
    leader.step()  # the configuration
    preferences = [{"instance_type": G5, "count": 1}]
    store.submit(JobRequest.model_validate({"name": "j1", "share": "team", "preferences": preferences}), "fake")
    leader.step()  # taken in; the cycle decides nothing, the watchdog starts counting
    assert not store.alerts()
    assert _cycles_logged(store) == 1, "the cycle the watchdog counted is in the input log"
    if failover:
        leader = _leader(engine, clock)
    clock.advance_to(clock.now() + 1.0)
    leader.step()  # the second cycle with the guarantee unmet
    assert [(a.kind, a.job) for a in store.alerts()] == [("GUARANTEE_VIOLATED", "j1")]


def test_an_idle_cycle_is_not_logged(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    clock = ManualClock(1_000_000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(quota({G5: 2}, share("team", {G5: 2})))
    leader = _leader(engine, clock)
    leader.step()
    for _ in range(5):
        clock.advance_to(clock.now() + 1.0)
        leader.step()
    assert _cycles_logged(store) == 0
