"""The leader keeps the open attempts in memory, updated from its own commits
(``QuotaService._committed_attempts``, ``_marked_done``) instead of reading them at every step:
after every step of scenarios with placements, preemptions with and without grace, cancels and
failures, what it keeps equals what the database holds, field for field and in the same order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_quota.service.scheduler import QuotaService
from airflow_quota.sim.scenario import load_scenario
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import Attempt
from benchmarks.service_replay import ServiceReplay
from tests.conftest import SCENARIOS

_FIELDS = tuple(column.key for column in Attempt.__table__.columns)


def _kept(service: QuotaService) -> list[tuple[Any, ...]]:
    """The open attempts as ``_track_open_attempts`` orders them, every column of each."""
    assert service._open is not None
    order = service._placement_order
    ordered = sorted(service._open.values(), key=lambda a: (a.placed_at, order.get(a.job_id, 0), a.job_id, a.number))
    return [tuple(getattr(attempt, name) for name in _FIELDS) for attempt in ordered]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_the_open_attempts_kept_are_the_stored_ones_after_every_step(path: Path, sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    replay = ServiceReplay(load_scenario(path), engine)
    service = replay.service
    compared = 0
    while replay.steps < 100_000 and replay.advance():
        if service._open is None:
            continue  # not loaded yet (no configuration taken in)
        kept = _kept(service)
        service._load_open_attempts()  # what the database holds, read as recovery reads it
        assert kept == _kept(service), f"step {replay.steps}"
        compared += len(kept)
    assert replay.steps < 100_000, "the replay did not end"
    assert compared > 0, "no attempt was ever open: nothing compared"
