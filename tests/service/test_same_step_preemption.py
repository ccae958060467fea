"""A victim preempted with no grace and placed again in the same step: the preemption stops the
attempt it preempted (attempt 1), not the one placed after it (attempt 2). Found by the chaos
test of ``test_database_faults.py``: attempt 1 ran on while attempt 2 started."""

from __future__ import annotations

from sqlalchemy import Engine, select

from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.models import Attempt, Preemption
from airflow_quota.store.repository import QuotaStore
from tests.builders import request

POOL = {
    "pool": {"capacity": {"ml.g5.xlarge": 2, "ml.g5.2xlarge": 2}},
    "shares": [
        {
            "name": "research",
            "capacity_limits": {"ml.g5.xlarge": 1, "ml.g5.2xlarge": 1},
            "strategy": "LEND_AND_BORROW",
            "borrow_limit": 200,
        },
        {"name": "prod", "capacity_limits": {"ml.g5.xlarge": 1, "ml.g5.2xlarge": 1}, "strategy": "LEND"},
    ],
}


def test_the_preemption_stops_the_preempted_attempt(engine: Engine) -> None:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    fake = FakeBackend(clock.now)
    store.apply_config(POOL)
    store.submit(request("own"), "fake", {"duration": 600})
    store.submit(request("own-2x", "research", ("ml.g5.2xlarge", 1)), "fake", {"duration": 600})
    mover = store.submit(
        request("mover", "research", ("ml.g5.2xlarge", 1), ("ml.g5.xlarge", 1)), "fake", {"duration": 600}
    )
    service = QuotaService(engine, {"fake": fake}, clock=clock)
    service.step()
    clock.advance_to(1010.0)
    service.step()  # all run; mover borrows prod's idle 2xlarge
    assert [a.instance_type for a in store.attempts(mover.id)] == ["ml.g5.2xlarge"]

    store.submit(request("reclaimer", "prod", ("ml.g5.2xlarge", 1)), "fake", {"duration": 600})
    clock.advance_to(1020.0)
    service.step()  # prod reclaims the 2xlarge; mover moves to prod's idle xlarge at once
    with engine.connect() as c:
        attempts = c.execute(
            select(Attempt.number, Attempt.instance_type, Attempt.status, Attempt.action)
            .where(Attempt.job_id == mover.id)
            .order_by(Attempt.number)
        ).all()
        preempted = c.scalars(select(Preemption.attempt).where(Preemption.job_id == mover.id)).all()
    assert [(a.number, a.instance_type) for a in attempts] == [(1, "ml.g5.2xlarge"), (2, "ml.g5.xlarge")], attempts
    assert attempts[0].status == "STOPPING", f"attempt 1 was never told to stop: {attempts}"
    assert list(preempted) == [1]
    clock.advance_to(1021.0)
    service.step()
    assert store.attempts(mover.id)[0].status == "STOPPED"
