"""Polling within budget (issue 15): each backend on its own interval, polls concurrent under a
cap, back-off on throttling, and a leader step that never waits on a backend.

The poller is driven inline with a manual clock (``poll_due(now)``, the path ``QuotaService.step``
takes when nobody started the poller's threads), except where the point is the background
threads; those tests wait on conditions, never on sleeps.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from sqlalchemy import Engine, select

from airflow_quota.core.model import JobRequest, PreferenceEntry
from airflow_quota.service.backends.base import (
    AttemptReport,
    AttemptSpec,
    AttemptStatus,
    BackendError,
    BackendThrottled,
)
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.backends.local import LocalBackend
from airflow_quota.service.backends.sagemaker import SageMakerBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.polling import THROTTLE_FIRST_SECONDS, AttemptKey, BackendPoller, Poller
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.models import Input
from airflow_quota.store.repository import QuotaStore

WAIT = 30.0
"""The longest any condition below is waited for (a hung test fails instead of hanging)."""


def spec(job_id: int, attempt: int = 1) -> AttemptSpec:
    return AttemptSpec(job_id, f"job-{job_id}", attempt, "research", "ml.g5.xlarge", 1, 1)


def specs(*job_ids: int) -> dict[AttemptKey, AttemptSpec]:
    return {(j, 1): spec(j) for j in job_ids}


class RecordingBackend:
    """Answers RUNNING and records when (by the manual clock) each attempt was asked about."""

    def __init__(self, name: str, clock: ManualClock, interval: float) -> None:
        self.name = name
        self.clock = clock
        self.poll_interval_seconds = interval
        self.asked: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def start(self, attempt: AttemptSpec) -> None:
        pass

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        pass

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        with self._lock:
            self.asked.append((self.clock.now(), attempt.job_id))
        return AttemptReport(AttemptStatus.RUNNING, running_since=0.0)


class GatedBackend(RecordingBackend):
    """Every poll waits until ``gate`` is set; ``in_flight`` and its peak are kept under a condition."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__("gated", clock, 0.0)
        self.gate = threading.Event()
        self.changed = threading.Condition()
        self.in_flight = 0
        self.peak = 0

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        with self.changed:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.changed.notify_all()
        try:
            assert self.gate.wait(WAIT), "the test never opened the gate"
            return super().poll(attempt)
        finally:
            with self.changed:
                self.in_flight -= 1
                self.changed.notify_all()


def test_each_backend_is_polled_on_its_own_interval() -> None:
    clock = ManualClock(0.0)
    slow, quick = RecordingBackend("slow", clock, 10.0), RecordingBackend("quick", clock, 3.0)
    poller = Poller({"slow": slow, "quick": quick}, clock.now)
    poller.track({"slow": specs(1), "quick": specs(2)}, clock.now())
    for second in range(31):
        clock.advance_to(float(second))
        poller.poll_due(clock.now())
    assert [at for at, _ in slow.asked] == [0.0, 10.0, 20.0, 30.0]
    assert [at for at, _ in quick.asked] == [float(s) for s in range(0, 31, 3)]


def test_attempts_seen_together_are_spread_over_one_interval_then_polled_once_per_interval() -> None:
    clock = ManualClock(0.0)
    backend = RecordingBackend("sagemaker", clock, 8.0)
    poller = BackendPoller(backend, clock.now, 8.0, workers=4)
    poller.track(specs(1, 2, 3, 4), 0.0)
    for second in range(24):
        clock.advance_to(float(second))
        poller.poll_due(clock.now())
    first = {job: min(at for at, j in backend.asked if j == job) for job in (1, 2, 3, 4)}
    assert first == {1: 0.0, 2: 2.0, 3: 4.0, 4: 6.0}
    assert Counter(at for at, _ in backend.asked) == Counter({t: 1 for t in range(0, 24, 2)}), "one call per 2 s"
    assert set(poller.reports()) == set(specs(1, 2, 3, 4))


def test_an_attempt_no_longer_open_is_forgotten_with_its_report() -> None:
    clock = ManualClock(0.0)
    backend = RecordingBackend("fake", clock, 0.0)
    poller = BackendPoller(backend, clock.now, 0.0, workers=2)
    poller.track(specs(1, 2), 0.0)
    poller.poll_due(0.0)
    clock.advance_to(1.0)
    poller.track(specs(2), 1.0)
    poller.poll_due(1.0)
    assert set(poller.reports()) == {(2, 1)}
    assert [job for at, job in backend.asked if at == 1.0] == [2]


def test_polls_run_concurrently_up_to_the_cap_and_no_further() -> None:
    clock = ManualClock(0.0)
    backend = GatedBackend(clock)
    poller = BackendPoller(backend, clock.now, 0.0, workers=3)
    poller.track(specs(*range(1, 8)), 0.0)
    done = threading.Thread(target=poller.poll_due, args=(0.0,))
    done.start()
    with backend.changed:
        assert backend.changed.wait_for(lambda: backend.in_flight == 3, WAIT), "three polls never ran at once"
    backend.gate.set()
    done.join(WAIT)
    assert not done.is_alive()
    assert backend.peak == 3, f"{backend.peak} polls ran at once with a cap of 3"
    assert len(backend.asked) == 7 and len(poller.reports()) == 7
    poller.stop()


class ThrottlingBackend(RecordingBackend):
    """Refuses for throttling while ``throttling`` is set."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__("sagemaker", clock, 5.0)
        self.throttling = True
        self.refused = 0

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        if self.throttling:
            self.refused += 1
            raise BackendThrottled("DescribeTrainingJob throttled: ThrottlingException: Rate exceeded")
        return super().poll(attempt)


def test_throttling_pauses_the_backend_with_exponential_back_off_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "airflow_quota.scheduler")
    clock = ManualClock(0.0)
    backend = ThrottlingBackend(clock)
    poller = BackendPoller(backend, clock.now, 5.0, workers=1)  # one at a time: the first refusal pauses the rest
    poller.track(specs(1, 2, 3), 0.0)  # first polls due at 0, 1.67 and 3.33 s
    assert poller.poll_due(0.0) == 1 and backend.refused == 1  # paused 1 s
    assert poller.poll_due(0.99) == 0, "polled during the pause"
    assert poller.poll_due(1.0) == 1 and backend.refused == 2  # paused 2 s
    assert poller.poll_due(2.99) == 0, "polled during the pause"
    poller.poll_due(3.0)  # two due: the first is refused (paused 4 s), the second is not asked
    assert backend.refused == 3 and not backend.asked
    assert poller.next_due() == pytest.approx(7.0)
    throttled = [r.getMessage() for r in caplog.records if "throttles calls" in r.getMessage()]
    assert [line.split("pause ")[1].split(" s")[0] for line in throttled] == ["1", "2", "4"]
    assert all("\n" not in line and "ThrottlingException" in line for line in throttled)

    backend.throttling = False
    assert poller.poll_due(7.0) == 3
    assert set(poller.reports()) == {(1, 1), (2, 1), (3, 1)}, "the attempts skipped while paused are asked at once"
    assert any("answers again after throttling" in r.getMessage() for r in caplog.records)
    backend.throttling = True
    poller.poll_due(12.0)
    assert poller.next_due() == pytest.approx(12.0 + THROTTLE_FIRST_SECONDS), "the back-off starts again at 1 s"


def test_sagemaker_throttling_codes_are_backend_throttled() -> None:
    client = boto3.client(
        "sagemaker", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    backend = SageMakerBackend(client=client)
    with Stubber(client) as stub:
        for code in ("ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded"):
            stub.add_client_error("describe_training_job", service_error_code=code, http_status_code=400)
        stub.add_client_error("describe_training_job", service_error_code="InternalFailure", http_status_code=500)
        for _ in range(4):
            with pytest.raises(BackendThrottled):
                backend.poll(spec(1))
        with pytest.raises(BackendError) as caught:
            backend.poll(spec(1))
        assert not isinstance(caught.value, BackendThrottled)
        stub.assert_no_pending_responses()


def test_a_rate_caps_the_polls_in_every_second_and_the_held_back_go_first_later() -> None:
    """200 attempts due every step, 40 a second allowed: at most 40 x 1.125 (the burst) in any
    second, about 40 a second on average, and none starves (the longest-due goes first)."""
    clock = ManualClock(0.0)
    backend = RecordingBackend("sagemaker", clock, 0.0)
    poller = BackendPoller(backend, clock.now, 0.0, workers=8, rate=40.0)
    poller.track(specs(*range(1, 201)), 0.0)
    for tick in range(201):  # 20 s in steps of 0.1 s
        clock.advance_to(tick / 10)
        poller.poll_due(clock.now())
    per_second = Counter(int(at) for at, _ in backend.asked)
    assert max(per_second.values()) <= 40 * 1.125, per_second
    assert sum(per_second[s] for s in range(20)) >= 40 * 20 - 5, per_second
    assert set(job for _, job in backend.asked) == set(range(1, 201)), "every attempt was asked about"
    soonest = poller.next_due()
    assert soonest is not None and soonest > clock.now(), "with no token left it waits for one"


def test_default_intervals_and_bad_settings() -> None:
    assert SageMakerBackend().poll_interval_seconds == 30.0
    assert SageMakerBackend().poll_calls_per_second == 35.0
    with pytest.raises(ValueError, match="poll_calls_per_second must be > 0"):
        BackendPoller(SageMakerBackend(), lambda: 0.0, 30.0, workers=1, rate=0)
    assert FakeBackend(lambda: 0.0).poll_interval_seconds == 0.0
    with pytest.raises(ValueError, match="poll_interval_seconds must be ≥ 0"):
        SageMakerBackend(poll_interval_seconds=-1)
    with pytest.raises(ValueError, match="poll_workers must be ≥ 1"):
        Poller({"fake": FakeBackend(lambda: 0.0)}, lambda: 0.0, workers=0)


def test_local_backend_default_interval(tmp_path: Any) -> None:
    assert LocalBackend(tmp_path).poll_interval_seconds == 1.0


# -- through the service ----------------------------------------------------------------------

POOL = {
    "pool": {"capacity": {"ml.g5.xlarge": 8}},
    "shares": [{"name": "research", "capacity_limits": {"ml.g5.xlarge": 8}, "strategy": "LEND_AND_BORROW"}],
}


def job(name: str) -> JobRequest:
    return JobRequest(
        name=name, share="research", priority=1, preferences=[PreferenceEntry(instance_type="ml.g5.xlarge", count=1)]
    )


class GatedFake(FakeBackend):
    """The fake backend whose polls wait on ``gate`` once ``closed`` is set."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock.now)
        self.closed = False
        self.gate = threading.Event()
        self.entered = threading.Event()

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        if self.closed:
            self.entered.set()
            assert self.gate.wait(WAIT), "the test never opened the gate"
        return super().poll(attempt)


def test_a_step_returns_while_a_poll_is_blocked_and_takes_the_report_in_later(engine: Engine) -> None:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    submitted = store.submit(job("blocked"), "fake", {"duration": 60})
    fake = GatedFake(clock)
    service = QuotaService(engine, {"fake": fake}, clock=clock)
    service.step()  # placed and started, inline
    service.step()  # polled inline: running
    assert store.jobs()[0].state == "RUNNING"
    clock.advance_to(1100.0)  # it has finished by now
    fake.closed = True
    service.poller.start()
    try:
        stepping = threading.Thread(target=service.step)
        stepping.start()  # tells the poller about the attempt, which asks the backend in its thread
        assert fake.entered.wait(WAIT), "the poller never asked the backend"
        stepping.join(WAIT)
        assert not stepping.is_alive(), "the step waited on the blocked poll"
        assert not fake.gate.is_set()
        service.step()  # again while the poll is still blocked: nothing known yet
        assert store.jobs()[0].state == "RUNNING"

        fake.gate.set()
        service.poller.stop()  # returns once the round in flight has stored its reports
        assert service.poller.reports()["fake"][submitted.id, 1].status is AttemptStatus.SUCCEEDED
        service.step()
        assert store.jobs()[0].state == "SUCCEEDED"
    finally:
        fake.gate.set()
        service.poller.stop()


def test_every_change_is_noticed_within_one_interval(engine: Engine) -> None:
    """Twelve jobs of different lengths, on a fake backend polled every 5 s, the clock stepped by
    half a second: each start and each finish is taken in at most 5 s after it happened."""
    interval = 5.0
    clock = ManualClock(0.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    durations = {f"job-{i}": 7.0 + 3.3 * i for i in range(12)}
    for name, duration in durations.items():
        store.submit(job(name), "fake", {"duration": duration, "startup": 1.5})
    fake = FakeBackend(clock.now, poll_interval_seconds=interval)
    service = QuotaService(engine, {"fake": fake}, clock=clock)
    while clock.now() < 120.0:
        service.step()
        clock.advance_to(clock.now() + 0.5)
    rows = {job.name: job for job in store.jobs()}
    assert {j.state for j in rows.values()} == {"SUCCEEDED"}
    with engine.connect() as c:
        taken_in = c.execute(select(Input.kind, Input.payload, Input.at).where(Input.kind.in_(["running", "finished"])))
        seen = {(kind, payload["job_id"]): at for kind, payload, at in taken_in}
    lateness = []
    for name, duration in durations.items():
        job_id = rows[name].id  # eight run at once: the rest start as others end
        running_since = store.attempts(job_id)[0].placed_at + 1.5
        lateness += [seen["running", job_id] - running_since, seen["finished", job_id] - (running_since + duration)]
    assert min(lateness) >= 0 and max(lateness) <= interval, lateness
    assert max(lateness) > interval / 2, "the polls were not spread: every change was seen almost at once"
