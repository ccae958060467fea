"""Starts and stops off the leader's step (issue 15): the poller's threads carry them out within
the backend's one rate, a throttled one is made again after the pause, and the step marks them
done with a fenced compare-and-set, so a deposed leader's late outcome is never written.

Where threads are the point, the tests wait on events the backend sets, never on sleeps.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, text

from airflow_quota.service.backends.base import (
    AttemptReport,
    AttemptSpec,
    AttemptStatus,
    BackendError,
    BackendThrottled,
    StartedAttempt,
)
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.polling import ActionKind, ActionOutcome, BackendAction, BackendPoller
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.lock import LeadershipLost, leader_lock
from airflow_quota.store.models import Attempt
from airflow_quota.store.repository import QuotaStore
from tests.builders import request

WAIT = 30.0
"""The longest any condition below is waited for (a hung test fails instead of hanging)."""

POOL = {
    "pool": {"capacity": {"ml.g5.xlarge": 8}},
    "shares": [{"name": "research", "capacity_limits": {"ml.g5.xlarge": 8}, "strategy": "LEND_AND_BORROW"}],
}


def spec(job_id: int) -> AttemptSpec:
    return AttemptSpec(job_id, f"job-{job_id}", 1, "research", "ml.g5.xlarge", 1, 1)


def start(job_id: int) -> BackendAction:
    return BackendAction(ActionKind.START, spec(job_id))


class GatedStarts(FakeBackend):
    """The fake backend whose starts wait on ``gate`` (``entered`` is set once one waits)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock.now)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def start(self, attempt: AttemptSpec) -> StartedAttempt:  # type: ignore[override]
        self.entered.set()
        assert self.gate.wait(WAIT), "the test never opened the gate"
        super().start(attempt)
        return StartedAttempt(f"fake-{attempt.key}")


def attempt_row(engine: Engine, job_id: int) -> Attempt:
    store = QuotaStore(engine)
    attempts = store.attempts(job_id)
    assert len(attempts) == 1, attempts
    return attempts[0]


def test_a_step_returns_while_a_start_is_in_flight_and_marks_it_done_later(engine: Engine) -> None:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    submitted = store.submit(request("slow-start"), "fake", {"duration": 60})
    fake = GatedStarts(clock)
    service = QuotaService(engine, {"fake": fake}, clock=clock)
    service.poller.start()
    try:
        stepping = threading.Thread(target=service.step)
        stepping.start()  # places the job and asks the poller to start it, in the poller's thread
        assert fake.entered.wait(WAIT), "the poller never asked the backend to start the attempt"
        stepping.join(WAIT)
        assert not stepping.is_alive(), "the step waited on the start"
        service.step()  # again while the start is still blocked: nothing to mark done yet
        row = attempt_row(engine, submitted.id)
        assert (row.action, row.status, row.external_name) == ("START", "STARTING", None)

        fake.gate.set()
        service.poller.stop()  # returns once the round in flight has kept the start's outcome
        service.step()  # marks it done
        row = attempt_row(engine, submitted.id)
        assert (row.action, row.status, row.external_name) == (None, "PENDING", f"fake-{submitted.id}-1")
        service.step()  # polled: running
        assert store.job(submitted.id).state == "RUNNING"  # type: ignore[union-attr]
        assert fake.starts == [f"{submitted.id}-1"], "started once"
    finally:
        fake.gate.set()
        service.poller.stop()


def test_a_start_outcome_arriving_after_the_lease_is_lost_is_not_written(engine: Engine) -> None:
    """The leader asks for a start; while the backend is creating it another scheduler takes the
    lease over. The start's outcome comes back to the deposed leader, whose next step must not
    write it: the fenced transaction rolls back and the leader steps down."""
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    submitted = store.submit(request("taken-over"), "fake", {"duration": 60})
    fake = GatedStarts(clock)
    service = QuotaService(engine, {"fake": fake}, clock=clock, holder="deposed")
    assert service.lock.acquire()
    service._fencing = True  # as QuotaService.run sets it once it leads
    service.recover()
    service.poller.start()
    try:
        service.step()  # placed, committed as STARTING, its start asked of the poller
        assert fake.entered.wait(WAIT), "the poller never asked the backend to start the attempt"

        with engine.begin() as connection:  # its lease runs out (a long pause), and another takes it
            connection.execute(text("UPDATE quota_leader SET expires_at = 0"))
        usurper = leader_lock(engine, "usurper")
        assert usurper.acquire() and usurper.epoch == 2

        fake.gate.set()
        service.poller.stop()  # the start has returned: its outcome waits for the next step
        with pytest.raises(LeadershipLost):
            service.step()
        row = attempt_row(engine, submitted.id)
        assert (row.action, row.status, row.external_name) == ("START", "STARTING", None), (
            "the late outcome was written"
        )
        assert fake.starts == [f"{submitted.id}-1"]  # the new leader starts it again: a no-op by its key
        usurper.release()
    finally:
        fake.gate.set()
        service.poller.stop()


def test_a_start_outcome_after_its_attempt_was_preempted_keeps_only_its_name(engine: Engine) -> None:
    """A START rewritten into a STOP (preempted while its start was in flight) is not marked done
    by the start's outcome: only the training job's name is kept; the STOP's own outcome ends it."""
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    submitted = store.submit(request("preempted-while-starting"), "fake", {"duration": 60})
    service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock)
    service.step()  # placed and started inline
    key = (submitted.id, 1)
    with engine.begin() as connection:  # as a preemption while the start was in flight leaves it
        connection.execute(text("UPDATE quota_attempts SET action = 'STOP', status = 'STOPPING', external_name = NULL"))
    service._mark_done([ActionOutcome(ActionKind.START, key, "preempted-while-starting", StartedAttempt("tj-1"))])
    row = attempt_row(engine, submitted.id)
    assert (row.action, row.status, row.external_name) == ("STOP", "STOPPING", "tj-1")
    service._mark_done([ActionOutcome(ActionKind.STOP, key, "preempted-while-starting")])
    row = attempt_row(engine, submitted.id)
    assert (row.action, row.status) == (None, "STOPPING")


class ThrottledOnce:
    """A backend whose first start is refused for throttling; a start costs two calls."""

    name = "throttled"
    poll_interval_seconds = 30.0
    calls_per_start = 2

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.refused = 0
        self.started: list[tuple[float, int]] = []
        self.polled: list[int] = []

    def start(self, attempt: AttemptSpec) -> None:
        if not self.refused:
            self.refused += 1
            raise BackendThrottled("CreateTrainingJob throttled: ThrottlingException: Rate exceeded")
        self.started.append((self.clock.now(), attempt.job_id))

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        raise AssertionError("nothing is stopped here")

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        raise AssertionError("nothing is polled here")


def test_a_throttled_start_is_made_again_after_the_pause_and_starts_stay_within_the_rate() -> None:
    """Rate 4 calls a second, a start is two calls (burst: one start): six starts asked at once.
    The first is throttled: nothing is called for the 1 s pause, then it goes first, and the
    starts follow at the rate, never more calls in any second than the bucket allows."""
    clock = ManualClock(0.0)
    backend = ThrottledOnce(clock)
    poller = BackendPoller(backend, clock.now, interval=30.0, workers=4, rate=4.0)
    poller.request(start(job_id) for job_id in range(1, 7))
    assert poller.act_due(0.0) == 1 and backend.refused == 1
    assert poller.take_outcomes() == [], "a throttled start has no outcome: it is made again"
    assert ((1, 1), ActionKind.START) in poller.requested()
    assert poller.next_due() == pytest.approx(1.0), "due again after the pause"
    assert poller.act_due(0.5) == 0, "called during the pause"
    while clock.now() < 4.0:
        clock.advance_to(clock.now() + 0.25)
        poller.act_due(clock.now())
    assert [job_id for _, job_id in backend.started] == [1, 2, 3, 4, 5, 6], "the throttled start went first"
    moments = [at for at, _ in backend.started]
    for second in range(4):  # calls in each second: at most the burst plus one second's tokens
        assert 2 * sum(second <= at < second + 1 for at in moments) <= 2 + 4, moments
    outcomes = poller.take_outcomes()
    assert [(o.kind, o.key, o.error) for o in outcomes] == [(ActionKind.START, (j, 1), None) for j in range(1, 7)]


class Answering:
    """A backend that starts at once and answers every poll RUNNING; a start costs two calls."""

    name = "answering"
    poll_interval_seconds = 30.0
    calls_per_start = 2

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, attempt: AttemptSpec) -> None:
        self.calls.append(f"start {attempt.key}")

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        self.calls.append(f"stop {attempt.key}")

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        self.calls.append(f"poll {attempt.key}")
        return AttemptReport(AttemptStatus.RUNNING)


def test_starts_stops_and_polls_share_one_budget() -> None:
    """Rate 4 calls a second (burst: one start's two calls). A start spends the whole burst, so
    the poll due at the same moment waits a quarter second for a token, and a stop asked for then
    waits for the next one: one bucket for every call to the backend."""
    clock = ManualClock(0.0)
    backend = Answering()
    poller = BackendPoller(backend, clock.now, interval=30.0, workers=2, rate=4.0)
    poller.track({(9, 1): spec(9)}, 0.0)
    poller.request([start(1)])
    assert (poller.act_due(0.0), poller.poll_due(0.0)) == (1, 0), "the poll spent the start's tokens"
    poller.request([BackendAction(ActionKind.STOP, spec(1), grace_seconds=5.0)])
    assert (poller.act_due(0.25), poller.poll_due(0.25)) == (1, 0), "the stop waited for tokens"
    assert (poller.act_due(0.5), poller.poll_due(0.5)) == (0, 1)
    assert backend.calls == ["start 1-1", "stop 1-1", "poll 9-1"]


class GatedAnswering(Answering):
    """``Answering`` whose starts wait on ``gate`` (``entered`` is set once one waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def start(self, attempt: AttemptSpec) -> None:
        self.entered.set()
        assert self.gate.wait(WAIT), "the test never opened the gate"
        super().start(attempt)


def test_a_stop_waits_for_its_attempts_start_in_flight_and_replaces_one_not_begun() -> None:
    backend = GatedAnswering()
    poller = BackendPoller(backend, ManualClock(0.0).now, interval=30.0, workers=4)
    starting = threading.Thread(target=poller.act_due, args=(0.0,))
    poller.request([start(1)])
    starting.start()
    assert backend.entered.wait(WAIT), "the start was never begun"
    poller.request([BackendAction(ActionKind.STOP, spec(1)), start(2), BackendAction(ActionKind.STOP, spec(2))])
    assert poller.act_due(0.0, wait=False) == 1, "only attempt 2's stop may begin: attempt 1's start is in flight"
    backend.gate.set()
    starting.join(WAIT)
    assert poller.act_due(0.0) == 1  # attempt 1's stop, now that its start has returned
    poller.stop()  # the pool's calls in flight return first
    assert sorted(backend.calls) == ["start 1-1", "stop 1-1", "stop 2-1"], "attempt 2's start was replaced"
    kinds = {(o.key, o.kind) for o in poller.take_outcomes()}
    assert kinds == {((1, 1), ActionKind.START), ((1, 1), ActionKind.STOP), ((2, 1), ActionKind.STOP)}


class GatedStops(Answering):
    """``Answering`` whose stops wait on ``gate`` (``entered`` is set once one waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        self.entered.set()
        assert self.gate.wait(WAIT), "the test never opened the gate"
        super().stop(attempt, grace_seconds)


def test_a_victims_new_attempt_starts_only_once_its_old_attempts_stop_has_returned() -> None:
    """A victim placed again in the cycle that preempted it (step 4b): the stop of attempt 1 and
    the start of attempt 2 are asked for together. The start waits for the stop to return, in
    the background (a later round) and inline (the same call); another job's start does not."""
    backend = GatedStops()
    poller = BackendPoller(backend, ManualClock(0.0).now, interval=30.0, workers=4)
    again = BackendAction(ActionKind.START, AttemptSpec(1, "job-1", 2, "research", "ml.g5.xlarge", 1, 1))
    poller.request([BackendAction(ActionKind.STOP, spec(1)), again, start(2)])
    assert poller.act_due(0.0, wait=False) == 2, "job 1's stop and job 2's start, not job 1's new attempt"
    assert backend.entered.wait(WAIT), "the stop was never begun"
    assert "start 1-2" not in backend.calls
    backend.gate.set()
    poller.stop()  # the calls in flight return
    assert poller.act_due(0.0) == 1  # now attempt 2 starts
    assert backend.calls.index("stop 1-1") < backend.calls.index("start 1-2")

    inline = BackendPoller(GatedStops(), ManualClock(0.0).now, interval=30.0, workers=4)
    inline.backend.gate.set()  # type: ignore[attr-defined]
    inline.request([BackendAction(ActionKind.STOP, spec(1)), again])
    assert inline.act_due(0.0) == 2, "inline, the held start follows its stop in the same call"
    assert inline.backend.calls == ["stop 1-1", "start 1-2"]  # type: ignore[attr-defined]
    inline.stop()


class RefusingStops(FakeBackend):
    """The fake backend whose first ``refusals`` stops fail (an API error), as StopTrainingJob
    may; ``stop_calls`` counts every stop asked of it."""

    def __init__(self, clock: ManualClock, refusals: int) -> None:
        super().__init__(clock.now)
        self.refusals = refusals
        self.stop_calls = 0

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        self.stop_calls += 1
        if self.refusals > 0:
            self.refusals -= 1
            raise BackendError(f"StopTrainingJob of {attempt.key} failed: InternalFailure")
        super().stop(attempt, grace_seconds)


def test_a_stop_the_backend_refuses_stays_asked_for_until_it_is_made(engine: Engine) -> None:
    """A running job is cancelled and the backend refuses its stop twice: the attempt keeps its
    STOP and the next steps ask for it again, until the third call stops it (the trace under
    chaos found a refused stop given up: the attempt ran on after its capacity was given away,
    and its job's next attempt ran beside it)."""
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    job = store.submit(request("refused-stop"), "fake", {"duration": 600})
    fake = RefusingStops(clock, refusals=2)
    service = QuotaService(engine, {"fake": fake}, clock=clock)
    key = f"{job.id}-1"
    for at in (1000.0, 1001.0, 1002.0):  # placed, started, seen running
        clock.advance_to(at)
        service.step()
    assert attempt_row(engine, job.id).status == "RUNNING"

    store.cancel(job.id)
    clock.advance_to(1010.0)
    service.step()  # the cancel taken in: its stop asked for, and refused
    assert fake.stop_calls == 1
    assert attempt_row(engine, job.id).action == "STOP", "a refused stop was given up"
    assert fake._load(key)["stop_at"] is None  # type: ignore[index]  # the training runs on

    for at in (1011.0, 1012.0, 1013.0, 1014.0):
        clock.advance_to(at)
        service.step()
    assert fake.stop_calls == 3, "the stop was not asked again until it was made, or asked again after"
    assert fake._load(key)["stop_at"] is not None  # type: ignore[index]
    row = attempt_row(engine, job.id)
    assert row.action is None and row.ended_at is not None, (row.action, row.status, row.ended_at)
