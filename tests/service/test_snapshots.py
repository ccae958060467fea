"""Recovery from snapshots through the quota service (``service/snapshots.py``): a leader that
takes over again and again from the newest snapshot and the inputs after it decides as the
simulator does; a snapshot that does not load is skipped for the one before, then the whole
log; with inputs pruned and no snapshot loading, the scheduler refuses to lead; a clean stop
leaves a snapshot the next leader needs nothing after."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, func, insert, select, update

from airflow_quota.core import snapshot
from airflow_quota.core.model import JobRequest
from airflow_quota.service import snapshots
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.sim.report import build_report
from airflow_quota.sim.simulator import Simulator
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import RETENTION_ROW, RetentionState, Snapshot
from airflow_quota.store.models import Input as InputRow
from airflow_quota.store.repository import QuotaStore
from benchmarks.service_replay import ServiceReplay, comparable
from tests.core.properties import congested_workload
from tests.waiting import wait_for

EVERY = 40
"""Inputs between snapshots: small, so that a short workload writes many."""


@pytest.fixture
def migrated(db_url: str) -> Engine:
    from airflow_quota.store.settings import normalize

    engine = make_engine(normalize(db_url))
    migrate(engine)
    return engine


def replay_with_takeovers(engine: Engine, jobs: int, seed: int, every_steps: int, damage: Callable[[], None]) -> None:
    """A congested workload through the service, a new leader recovering every ``every_steps``
    steps after ``damage`` (to the stored snapshots); its decisions must be the simulator's."""
    loaded = congested_workload(jobs, seed)
    replay = ServiceReplay(loaded, engine, service_options={"snapshot_every": EVERY})
    takeovers = 0
    while replay.advance():
        assert replay.steps < 50_000, "the replay did not end"
        if replay.steps % every_steps == 0:
            damage()
            replay.service.recover()
            takeovers += 1
    expected = comparable(build_report(Simulator(loaded).run())["events"])
    assert comparable(replay.records()[0]) == expected
    assert takeovers >= 5


def snapshot_ids(engine: Engine) -> list[int]:
    with engine.connect() as connection:
        return list(connection.scalars(select(Snapshot.id).order_by(Snapshot.id.desc())))


def test_a_leader_recovering_from_snapshots_again_and_again_decides_as_the_simulator(
    migrated: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "airflow_quota.scheduler")
    replay_with_takeovers(migrated, 80, 5, 25, lambda: None)
    assert snapshot_ids(migrated)[0] >= 5, "few snapshots were written"  # retention keeps the newest few
    from_snapshots = [r.getMessage() for r in caplog.records if r.getMessage().startswith("recovered from snapshot")]
    assert len(from_snapshots) >= 4, "the takeovers did not start from snapshots"


def _rewrite(engine: Engine, snapshot_id: int, payload: bytes, keep_checksum: bool) -> None:
    values: dict[str, object] = {"payload": payload}
    if not keep_checksum:
        values["checksum"] = snapshot.checksum(payload)
    with engine.begin() as connection:
        connection.execute(update(Snapshot).where(Snapshot.id == snapshot_id).values(**values))


def _payload(engine: Engine, snapshot_id: int) -> bytes:
    with engine.connect() as connection:
        return bytes(connection.scalar(select(Snapshot.payload).where(Snapshot.id == snapshot_id)) or b"")


@pytest.mark.parametrize(
    ("harm", "why"),
    [
        ("damaged", "its checksum differs"),
        ("older format", "it is of format 0"),
        ("other layout", "its classes are laid out as"),
    ],
)
def test_a_newest_snapshot_that_does_not_load_is_skipped_for_the_one_before(
    migrated: Engine, caplog: pytest.LogCaptureFixture, harm: str, why: str
) -> None:
    caplog.set_level(logging.INFO, "airflow_quota.scheduler")

    def damage() -> None:
        ids = snapshot_ids(migrated)
        if not ids:
            return
        data = _payload(migrated, ids[0])
        if harm == "damaged":
            _rewrite(migrated, ids[0], data[:-10] + b"0123456789", keep_checksum=True)
        elif harm == "older format":
            _rewrite(
                migrated,
                ids[0],
                data.replace(f'"format": {snapshot.SNAPSHOT_FORMAT}'.encode(), b'"format": 0', 1),
                keep_checksum=False,
            )
        else:
            _rewrite(
                migrated,
                ids[0],
                data.replace(snapshot.LAYOUTS[snapshot.SNAPSHOT_FORMAT].encode(), b"f" * 16, 1),
                keep_checksum=False,
            )

    replay_with_takeovers(migrated, 60, 8, 20, damage)
    messages = [r.getMessage() for r in caplog.records]
    skipped = [m for m in messages if "skipped" in m and why in m]
    assert len(skipped) >= 3, f"no snapshot was skipped ({why})"
    assert any(m.startswith("recovered from snapshot") for m in messages), "none before it was used"


def test_with_no_snapshot_loading_recovery_replays_the_whole_log(
    migrated: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "airflow_quota.scheduler")

    def damage_all() -> None:
        for snapshot_id in snapshot_ids(migrated):
            _rewrite(migrated, snapshot_id, b"not a snapshot", keep_checksum=False)

    replay_with_takeovers(migrated, 60, 9, 20, damage_all)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m == "recovering from the whole input log, since no snapshot loads" for m in messages)
    assert not any(m.startswith("recovered from snapshot") for m in messages)


def _store_with_a_job(engine: Engine) -> QuotaStore:
    store = QuotaStore(engine)
    store.apply_config(
        {
            "pool": {"capacity": {"ml.g5.xlarge": 2}},
            "shares": [{"name": "team", "capacity_limits": {"ml.g5.xlarge": 2}}],
        }
    )
    request = {"name": "train", "share": "team", "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}]}
    store.submit(JobRequest.model_validate(request), "fake")
    return store


def test_with_inputs_pruned_and_no_snapshot_loading_the_scheduler_refuses_to_lead(
    migrated: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_quota.service.backends.fake import FakeBackend

    _store_with_a_job(migrated)
    with migrated.begin() as connection:
        marked = connection.execute(
            update(RetentionState).where(RetentionState.name == RETENTION_ROW).values(inputs_pruned_through=1)
        )
        if not marked.rowcount:
            connection.execute(insert(RetentionState).values(name=RETENTION_ROW, inputs_pruned_through=1))
    service = QuotaService(migrated, {"fake": FakeBackend(time.time)}, lease_seconds=2.0)
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,))
    runner.start()
    runner.join(timeout=60)
    stopped = not runner.is_alive()
    stop.set()
    runner.join()
    assert stopped, "the scheduler went on without a state it could trust"
    assert service.cannot_lead is not None and "retention has pruned the inputs" in service.cannot_lead
    assert any("cannot lead" in r.getMessage() for r in caplog.records)


def test_a_clean_stop_leaves_a_snapshot_after_the_last_input(migrated: Engine) -> None:
    from airflow_quota.service.backends.fake import FakeBackend

    store = _store_with_a_job(migrated)
    hour_long = FakeBackend(time.time, remaining=lambda _: 3600.0)
    service = QuotaService(migrated, {"fake": hour_long}, lease_seconds=2.0)
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,))
    runner.start()
    try:
        wait_for(lambda: store.jobs()[0].state == "RUNNING", 60, "the job to run")
    finally:
        stop.set()
        service.wake()
        runner.join()
    with migrated.connect() as connection:
        last_input = connection.scalar(select(func.max(InputRow.id)))
        newest = connection.execute(
            select(Snapshot.last_input_id, Snapshot.jobs).order_by(Snapshot.id.desc()).limit(1)
        ).one()
    assert newest.last_input_id == last_input
    with QuotaService(migrated, {"fake": FakeBackend(time.time)}).sessions() as session:
        recovered = snapshots.recover(session, inputs_pruned=False)
    assert recovered.replayed == 0 and recovered.scheduler is not None
    assert list(recovered.scheduler.state.refs) == [store.jobs()[0].id], "the snapshot lost the running job"
