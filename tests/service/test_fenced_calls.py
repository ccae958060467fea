"""Fenced backend calls (issue 39): a start or stop made by a leader that lost its lease between
its poller's check and the call has no effect that outlives it.

Each test freezes the stale leader's poller thread just after its lease check said yes and
before the backend call (its ``still_wanted`` wrapped: the check, then a wait on an event), lets
the lease run out, has a second scheduler take over on the same PostgreSQL database and the same
fake backend's files (as a second process would) and make the conflicting decision, then lets
the frozen call go. Afterwards nothing runs in the backend that the books do not show open, the
job ends as the new leader decided, and no decision of the stale leader is written after the
takeover. Late starts are the harmful direction (a training nobody follows); a late stop is
shown to touch nothing the log does not already hold.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from sqlalchemy import Engine, func, select, text

from airflow_quota.service.backends.base import (
    STOPPED_BEFORE_START,
    AttemptReport,
    AttemptSpec,
    AttemptStatus,
    BackendError,
    BackendThrottled,
)
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.backends.sagemaker import SageMakerBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.polling import ActionKind, BackendAction, BackendPoller
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.lock import LeadershipLost
from airflow_quota.store.models import Attempt, EventRow
from airflow_quota.store.repository import QuotaStore
from tests.builders import request
from tests.moto_server import REGION
from tests.service.test_sagemaker_backend import NOT_FOUND, expect_not_found
from tests.service.test_sagemaker_backend import attempt as sagemaker_attempt
from tests.service.test_same_step_preemption import POOL as RECLAIMED_POOL

WAIT = 30.0
"""The longest a frozen call waits to be let go (a hung test fails instead of hanging)."""

POOL = {
    "pool": {"capacity": {"ml.g5.xlarge": 8}},
    "shares": [{"name": "research", "capacity_limits": {"ml.g5.xlarge": 8}, "strategy": "LEND_AND_BORROW"}],
}


@pytest.fixture
def db_url(postgres_url: str) -> str:
    """PostgreSQL only: the fencing under test is PostgreSQL's (``conftest.engine`` migrates it)."""
    return postgres_url


@dataclass
class Freeze:
    """A poller thread held between its lease check and its backend call."""

    frozen: threading.Event = field(default_factory=threading.Event)
    """Set once an action of the kind has passed the check and waits."""
    release: threading.Event = field(default_factory=threading.Event)
    """Lets the frozen call go on."""


def freeze_between_check_and_call(service: QuotaService, kind: ActionKind) -> Freeze:
    """Wrap the service's check before each backend call: the first ``kind`` action it lets
    through waits on the freeze's ``release`` before going on to its call."""
    freeze = Freeze()
    check = service.guards.still_wanted

    def checked_then_frozen(action: BackendAction) -> bool:
        wanted = check(action)
        if wanted and action.kind is kind and not freeze.frozen.is_set():
            freeze.frozen.set()
            freeze.release.wait(WAIT)
        return wanted

    service.poller.set_still_wanted(checked_then_frozen)
    return freeze


def leader(engine: Engine, backend: FakeBackend, clock: ManualClock, holder: str) -> QuotaService:
    """A scheduler that has taken the lease and recovered, as ``QuotaService.run`` leaves one."""
    service = QuotaService(engine, {"fake": backend}, clock=clock, holder=holder)
    assert service.lock.acquire(), f"{holder} could not take the lease"
    service._fencing = True
    service.recover()
    return service


def lease_runs_out(engine: Engine) -> None:
    """The stale leader's lease expires while it is frozen."""
    with engine.begin() as connection:
        connection.execute(text("UPDATE quota_leader SET expires_at = 0"))


def decisions_of_epoch(engine: Engine, epoch: int | None) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).where(EventRow.leader_epoch == epoch)) or 0)


def running_outside_books(engine: Engine, backend: FakeBackend) -> list[str]:
    """The attempts the backend has not ended (running, or starting) that the log does not show
    open: a training nobody follows, holding capacity outside the books."""
    with engine.connect() as connection:
        rows = connection.execute(select(Attempt.job_id, Attempt.number).where(Attempt.ended_at.is_(None))).all()
    open_keys = {f"{job_id}-{number}" for job_id, number in rows}
    outside = []
    for key in backend.attempt_keys():
        job_id, number = (int(part) for part in key.split("-"))
        report = backend.poll(AttemptSpec(job_id, "", number, "", "", 0, 0))
        if not report.status.ended and key not in open_keys:
            outside.append(f"{key} ({report.status.value})")
    return outside


def stale_step(stale: QuotaService) -> None:
    """The stale leader's next step once awake: it commits nothing. It steps down when it has
    something to write (its fence fails); with nothing to write it learns of the loss at its run
    loop's next lease check, which this test's driving of the step leaves out."""
    with contextlib.suppress(LeadershipLost):
        stale.step()
    with stale.engine.connect() as connection:
        assert not stale.lock.holds(connection), "the stale leader still holds the lease"


def final_state(store: QuotaStore, job_id: int) -> tuple[str, str | None]:
    """The job's state and reason, as the scheduler last wrote them."""
    row = store.job(job_id)
    assert row is not None
    return row.state, row.reason


def only_attempt(store: QuotaStore, job_id: int) -> Attempt:
    attempts = store.attempts(job_id)
    assert len(attempts) == 1, attempts
    return attempts[0]


class ThrottledFirstStart(FakeBackend):
    """The fake backend refusing its first start for throttling: the start waits for the pause."""

    throttled = False

    def start(self, attempt: AttemptSpec) -> None:
        if not self.throttled:
            self.throttled = True
            raise BackendThrottled("rate exceeded (the test's)")
        super().start(attempt)


class FailingFirstStart(FakeBackend):
    """The fake backend failing its first start (an API error): nothing is created."""

    failed = False

    def start(self, attempt: AttemptSpec) -> None:
        if not self.failed:
            self.failed = True
            raise BackendError("InternalFailure (the test's)")
        super().start(attempt)


def test_a_late_start_of_an_attempt_the_new_leader_stopped_never_runs(engine: Engine, tmp_path: Path) -> None:
    """The new leader takes the cancel in while its own start is held back (throttled): the
    attempt is stopped before anything ran. The stale leader's start, let go afterwards, meets
    the backend's tombstone and runs nothing."""
    clock = ManualClock(1000.0)
    state = tmp_path / "fake"
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    job = store.submit(request("cancelled-meanwhile"), "fake", {"duration": 60})
    stale_backend = FakeBackend(clock.now, state)
    stale = leader(engine, stale_backend, clock, "stale")
    freeze = freeze_between_check_and_call(stale, ActionKind.START)
    stale.poller.start()
    try:
        stale.step()  # placed and committed as STARTING; its start's thread passes the check and freezes
        assert freeze.frozen.wait(WAIT), "the stale leader never came to its start"
        stale_epoch = stale.lock.epoch

        lease_runs_out(engine)
        new_backend = ThrottledFirstStart(clock.now, state)
        new = leader(engine, new_backend, clock, "new")  # asks for the start again: throttled, held 1 s
        assert new.lock.epoch != stale_epoch
        taken_over = decisions_of_epoch(engine, stale_epoch)
        store.cancel(job.id)
        new.step()  # the cancel turns the START into a STOP, which replaces the start held back
        clock.advance_to(1002.0)
        new.step()  # the stop, of an attempt never started: a tombstone
        new.step()  # polled: stopped before it started
        assert final_state(store, job.id) == ("FAILED", "CANCELLED")
        row = only_attempt(store, job.id)
        assert (row.status, row.reason, row.action) == ("STOPPED", STOPPED_BEFORE_START, None)

        freeze.release.set()  # the stale leader wakes and makes its start
        stale.poller.stop()  # ... which has returned
        stale_step(stale)

        assert stale_backend.starts == [] and new_backend.starts == [], "the attempt was started"
        key = AttemptSpec(job.id, "", 1, "", "", 0, 0)
        assert FakeBackend(clock.now, state).poll(key) == AttemptReport(
            AttemptStatus.STOPPED, STOPPED_BEFORE_START, ended_at=1002.0
        )
        clock.advance_to(1100.0)  # long after the training would have ended had it run
        new.step()
        assert running_outside_books(engine, new_backend) == []
        assert final_state(store, job.id) == ("FAILED", "CANCELLED")
        assert decisions_of_epoch(engine, stale_epoch) == taken_over, "the stale leader wrote a decision"
    finally:
        freeze.release.set()
        stale.poller.stop()


def test_a_late_start_of_an_attempt_the_new_leader_gave_up_is_stopped_again(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The new leader's own start of the attempt fails, so the attempt fails and the job with it
    (no retries): no stop, so no tombstone. The stale leader's start, let go afterwards, creates
    the attempt; its check after the call finds the lease gone and the attempt ended in the log,
    and stops it at once."""
    clock = ManualClock(1000.0)
    state = tmp_path / "fake"
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    job = store.submit(request("given-up"), "fake", {"duration": 60})
    stale_backend = FakeBackend(clock.now, state)
    stale = leader(engine, stale_backend, clock, "stale")
    freeze = freeze_between_check_and_call(stale, ActionKind.START)
    stale.poller.start()
    try:
        stale.step()
        assert freeze.frozen.wait(WAIT), "the stale leader never came to its start"
        stale_epoch = stale.lock.epoch

        lease_runs_out(engine)
        new_backend = FailingFirstStart(clock.now, state)
        new = leader(engine, new_backend, clock, "new")  # its start of the attempt fails
        taken_over = decisions_of_epoch(engine, stale_epoch)
        clock.advance_to(1001.0)
        new.step()  # polled: the backend has no such attempt, a failed start: the job fails
        assert final_state(store, job.id) == ("FAILED", "ATTEMPTS_EXHAUSTED")
        assert only_attempt(store, job.id).ended_at is not None

        clock.advance_to(1005.0)
        with caplog.at_level(logging.WARNING, logger="airflow_quota.scheduler"):
            freeze.release.set()
            stale.poller.stop()  # the late start has returned, checked and been undone
        stale_step(stale)

        assert stale_backend.starts == [f"{job.id}-1"], "the late start was not made: the test shows nothing"
        key = AttemptSpec(job.id, "", 1, "", "", 0, 0)
        report = FakeBackend(clock.now, state).poll(key)
        assert (report.status, report.ended_at) == (AttemptStatus.STOPPED, 1005.0), f"not stopped again: {report}"
        assert any("started after this scheduler lost the lease" in r.getMessage() for r in caplog.records)
        clock.advance_to(1100.0)
        new.step()
        assert running_outside_books(engine, new_backend) == []
        assert final_state(store, job.id) == ("FAILED", "ATTEMPTS_EXHAUSTED")
        assert decisions_of_epoch(engine, stale_epoch) == taken_over, "the stale leader wrote a decision"
    finally:
        freeze.release.set()
        stale.poller.stop()


def test_a_late_stop_touches_only_the_attempt_the_log_stopped(engine: Engine, tmp_path: Path) -> None:
    """A victim's attempt 1 is preempted and the job placed again at once (attempt 2). The
    stale leader's stop of attempt 1 freezes; the new leader stops attempt 1 and runs attempt 2.
    The stop let go afterwards does nothing: attempt 2 runs to its end, the job succeeds."""
    clock = ManualClock(1000.0)
    state = tmp_path / "fake"
    store = QuotaStore(engine, clock.now)
    store.apply_config(RECLAIMED_POOL)
    store.submit(request("own"), "fake", {"duration": 600})
    store.submit(request("own-2x", "research", ("ml.g5.2xlarge", 1)), "fake", {"duration": 600})
    mover = store.submit(
        request("mover", "research", ("ml.g5.2xlarge", 1), ("ml.g5.xlarge", 1)), "fake", {"duration": 600}
    )
    stale_backend = FakeBackend(clock.now, state)
    stale = leader(engine, stale_backend, clock, "stale")
    stale.step()
    clock.advance_to(1010.0)
    stale.step()  # all run (started inline); mover borrows prod's idle 2xlarge
    freeze = freeze_between_check_and_call(stale, ActionKind.STOP)
    stale.poller.start()
    try:
        store.submit(request("reclaimer", "prod", ("ml.g5.2xlarge", 1)), "fake", {"duration": 600})
        clock.advance_to(1020.0)
        stale.step()  # prod reclaims: mover's attempt 1 to stop (frozen), attempt 2 placed, held behind it
        assert freeze.frozen.wait(WAIT), "the stale leader never came to its stop"
        stale_epoch = stale.lock.epoch

        lease_runs_out(engine)
        new_backend = FakeBackend(clock.now, state)
        new = leader(engine, new_backend, clock, "new")  # stops attempt 1, then starts attempt 2
        taken_over = decisions_of_epoch(engine, stale_epoch)
        clock.advance_to(1021.0)
        new.step()
        assert [(a.number, a.status) for a in store.attempts(mover.id)] == [(1, "STOPPED"), (2, "RUNNING")]

        freeze.release.set()  # the stale leader's stop of attempt 1 is made now
        stale.poller.stop()
        stale_step(stale)

        assert f"{mover.id}-2" not in stale_backend.starts, "attempt 2 was started before attempt 1's stop returned"
        for moment in (1022.0, 1700.0):  # attempt 2 runs, then ends by itself
            clock.advance_to(moment)
            new.step()
            assert running_outside_books(engine, new_backend) == []
        assert [(a.number, a.status) for a in store.attempts(mover.id)] == [(1, "STOPPED"), (2, "SUCCEEDED")]
        assert final_state(store, mover.id) == ("SUCCEEDED", None)
        assert decisions_of_epoch(engine, stale_epoch) == taken_over, "the stale leader wrote a decision"
    finally:
        freeze.release.set()
        stale.poller.stop()


@pytest.mark.parametrize("in_files", [False, True], ids=["memory", "files"])
def test_the_fake_backend_keeps_a_tombstone_for_an_attempt_stopped_before_it_started(
    in_files: bool, tmp_path: Path
) -> None:
    clock = ManualClock(1000.0)
    backend = FakeBackend(clock.now, tmp_path / "fake" if in_files else None)
    attempt = AttemptSpec(7, "job-7", 1, "research", "ml.g5.xlarge", 1, 1, training={"duration": 60})
    assert backend.poll(attempt).status is AttemptStatus.UNKNOWN
    backend.stop(attempt, grace_seconds=30)
    tombstone = AttemptReport(AttemptStatus.STOPPED, STOPPED_BEFORE_START, ended_at=1000.0)
    assert backend.poll(attempt) == tombstone
    clock.advance_to(1010.0)
    backend.start(attempt)  # late: does nothing
    backend.stop(attempt, grace_seconds=30)
    assert backend.poll(attempt) == tombstone
    assert backend.starts == [] and backend.attempt_keys() == ["7-1"] and backend.all_ended()


def test_of_a_start_and_a_stop_racing_from_two_schedulers_the_attempt_ends_stopped(tmp_path: Path) -> None:
    """Two fake backends on one state directory (two schedulers' processes): a start and a stop
    of the same attempt at the same moment leave it stopped whichever comes first, never running."""
    clock = ManualClock(1000.0)
    starter, stopper = FakeBackend(clock.now, tmp_path / "fake"), FakeBackend(clock.now, tmp_path / "fake")
    attempts = [AttemptSpec(job, f"job-{job}", 1, "research", "ml.g5.xlarge", 1, 1) for job in range(1, 101)]
    for attempt in attempts:
        attempt.training["duration"] = 60
        both = threading.Barrier(2, timeout=WAIT)

        def start(attempt: AttemptSpec = attempt, both: threading.Barrier = both) -> None:
            both.wait()
            starter.start(attempt)

        racer = threading.Thread(target=start)
        racer.start()
        both.wait()
        stopper.stop(attempt, grace_seconds=0)
        racer.join(WAIT)
    reports = [starter.poll(attempt) for attempt in attempts]
    assert [r.status for r in reports] == [AttemptStatus.STOPPED] * len(attempts), reports


def test_a_late_sagemaker_start_is_stopped_again_by_the_check_after_the_call() -> None:
    """SageMaker keeps no tombstone: the new leader's stop of a job never created finds nothing,
    and the stale leader's start, made afterwards, creates it. The check after the call then
    stops it (a Stubber answers, in the order SageMaker would; moto has no StopTrainingJob)."""
    client = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    backend = SageMakerBackend(client=client)
    spec = sagemaker_attempt()
    name = backend.job_name(spec)
    with Stubber(client) as stub:
        stub.add_client_error(
            "stop_training_job", service_error_code="ValidationException", service_message=NOT_FOUND
        )  # the new leader's stop
        expect_not_found(stub, name)  # the stale leader's late start: looked up, then created
        stub.add_response("create_training_job", {"TrainingJobArn": f"arn:aws:sagemaker:::training-job/{name}"})
        stub.add_response("stop_training_job", {}, expected_params={"TrainingJobName": name})  # undone

        backend.stop(spec, grace_seconds=0)
        poller = BackendPoller(backend, ManualClock(1000.0).now, interval=30.0, workers=1)
        poller.still_wanted = lambda action: True  # the check before the call had said yes
        asked: list[BackendAction] = []

        def undo(action: BackendAction) -> BackendAction:
            asked.append(action)
            return BackendAction(ActionKind.STOP, action.spec, 0.0)  # as the service answers, lease gone

        poller.undo_of_start = undo
        poller.request([BackendAction(ActionKind.START, spec)])
        assert poller.act_due(1000.0) == 1
        poller.stop()
        stub.assert_no_pending_responses()
    assert [action.kind for action in asked] == [ActionKind.START]
    assert poller.take_outcomes() == [], "a start undone reports nothing"
