"""The leader keeps the open attempts in memory, updated from its own commits
(``OpenAttempts.committed``, ``marked_done``) instead of reading them at every step:
after every step of scenarios with placements, preemptions with and without grace, cancels and
failures, what it keeps equals what the database holds, field for field and in the same order,
and the backend actions pending (what ``_dispatch`` reads from it) are all on open attempts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from airflow_quota.service.scheduler import QuotaService
from airflow_quota.sim.scenario import load_scenario
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import Attempt, JobRow
from benchmarks.service_replay import ServiceReplay
from tests.conftest import SCENARIOS

_FIELDS = tuple(column.key for column in Attempt.__table__.columns)


def _kept(service: QuotaService) -> list[tuple[Any, ...]]:
    """The open attempts as ``_track_open_attempts`` orders them, every column of each."""
    kept = service.open_attempts
    assert kept.loaded
    order = kept.placement_order
    ordered = sorted(kept.by_key.values(), key=lambda a: (a.placed_at, order.get(a.job_id, 0), a.job_id, a.number))
    return [tuple(getattr(attempt, name) for name in _FIELDS) for attempt in ordered]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_the_open_attempts_kept_are_the_stored_ones_after_every_step(path: Path, sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    replay = ServiceReplay(load_scenario(path), engine)
    service = replay.service
    compared = 0
    actions: list[int] = []
    dispatch = service._dispatch

    def _dispatch_checked() -> None:
        """Where ``_dispatch`` reads the actions pending from the open attempts it keeps: the
        stored ones must be those, all on open attempts."""
        with engine.connect() as connection:
            stored = connection.execute(
                select(Attempt.job_id, Attempt.number, Attempt.ended_at, Attempt.action).where(
                    Attempt.action.is_not(None)
                )
            ).all()
        assert all(ended is None for _, _, ended, _ in stored), f"step {replay.steps}: an action on an ended attempt"
        kept_attempts = service._open_attempts()  # read at its first use, as _dispatch does
        kept = {(a.job_id, a.number, a.action) for a in kept_attempts.by_key.values() if a.action is not None}
        assert {(job, number, action) for job, number, _, action in stored} == kept, f"step {replay.steps}"
        actions.append(len(stored))
        dispatch()

    service._dispatch = _dispatch_checked  # type: ignore[method-assign]
    while replay.steps < 100_000 and replay.advance():
        if not service.open_attempts.loaded:
            continue  # not loaded yet (no configuration taken in)
        kept = _kept(service)
        service.open_attempts.forget()
        service._open_attempts()  # what the database holds, read as recovery reads it
        assert kept == _kept(service), f"step {replay.steps}"
        compared += len(kept)
    assert replay.steps < 100_000, "the replay did not end"
    assert compared > 0, "no attempt was ever open: nothing compared"
    assert sum(actions) > 0, "no backend action was ever pending: nothing compared"


_SUBMITTED_FIELDS = ("id", "name", "share", "backend", "request", "training", "aws_conn_id")
"""What a submission fixes: the only columns the leader reads from the rows it keeps."""


@pytest.mark.parametrize("path", SCENARIOS[:6], ids=[p.stem for p in SCENARIOS[:6]])
def test_the_job_rows_kept_match_the_stored_ones_and_are_forgotten_with_their_jobs(path: Path, sqlite_url: str) -> None:
    """The rows the leader keeps (``QuotaService._submitted_rows``) say what the database says of
    every column it reads from them; a snapshot forgets those of jobs the core no longer holds."""
    engine = make_engine(sqlite_url)
    migrate(engine)
    replay = ServiceReplay(load_scenario(path), engine, service_options={"snapshot_every": 5})
    service = replay.service
    checked = 0
    snapshots_seen = 0
    while replay.steps < 100_000 and replay.advance():
        kept = service._submitted
        if not kept:
            continue
        with service.sessions() as session:
            stored = {row.id: row for row in session.scalars(select(JobRow).where(JobRow.id.in_(list(kept))))}
        for job_id, row in kept.items():
            assert job_id in stored, f"step {replay.steps}: job {job_id} kept, not stored"
            assert [getattr(row, name) for name in _SUBMITTED_FIELDS] == [
                getattr(stored[job_id], name) for name in _SUBMITTED_FIELDS
            ]
            checked += 1
        if service._inputs_since_snapshot == 0 and service.scheduler is not None:
            snapshots_seen += 1
            assert set(kept) <= set(service.scheduler.state.refs), f"step {replay.steps}: a forgotten job's row kept"
    assert checked > 0, "no job row was ever kept: nothing compared"
    assert snapshots_seen > 0, "no snapshot was written: forgetting not checked"
