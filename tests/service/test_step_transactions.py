"""The leader's step ends every transaction it opens with a COMMIT, its reads too
(``QuotaService._session``): psycopg forgets every statement it has prepared on a connection at
each ROLLBACK, so one ROLLBACK a step would have every statement of the next step parsed and
planned again. On scenarios with submissions, preemptions, priority changes and cancels, on
SQLite and PostgreSQL, no step rolls back."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, event

from airflow_quota.sim.scenario import load_scenario
from benchmarks.service_replay import ServiceReplay
from tests.conftest import SCENARIOS


@pytest.mark.parametrize(
    "name", ["s15_preemption_retries", "s21_priority_changes", "s39_cancelled_victim_stays_cancelled"]
)
def test_no_step_rolls_back(name: str, engine: Engine) -> None:
    replay = ServiceReplay(load_scenario(next(path for path in SCENARIOS if path.stem == name)), engine)
    service = replay.service
    stepping = [False]
    rolled_back: list[int] = []

    def _rollback(connection: Any) -> None:
        if stepping[0]:
            rolled_back.append(replay.steps)

    event.listen(engine, "rollback", _rollback)
    step = service.step

    def _step() -> bool:
        stepping[0] = True
        try:
            return step()
        finally:
            stepping[0] = False

    service.step = _step  # type: ignore[method-assign]
    assert replay.run(max_steps=5_000), "the scenario did not end"
    assert replay.steps >= 5
    assert rolled_back == [], f"steps {sorted(set(rolled_back))} rolled a transaction back"
