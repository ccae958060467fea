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
from collections.abc import Sequence
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from sqlalchemy import Engine, select

from airflow_quota.service.backends.base import (
    AttemptReport,
    AttemptSpec,
    AttemptStatus,
    BackendError,
    BackendThrottled,
    ChangePage,
    ListedChange,
    ListsChanges,
)
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.backends.local import LocalBackend
from airflow_quota.service.backends.sagemaker import SageMakerBackend
from airflow_quota.service.clock import ManualClock, WallClock
from airflow_quota.service.polling import (
    THROTTLE_FIRST_SECONDS,
    ActionKind,
    AttemptKey,
    BackendAction,
    BackendPoller,
    Known,
    Poller,
)
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.models import Input
from airflow_quota.store.repository import QuotaStore
from tests.builders import request
from tests.waiting import wait_for

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
    submitted = store.submit(request("blocked"), "fake", {"duration": 60})
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
        store.submit(request(name), "fake", {"duration": duration, "startup": 1.5})
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


# -- backends that list their changes ----------------------------------------------------------


class ListingFake(FakeBackend):
    """The fake backend with ``ListsChanges``: it lists the attempts whose fake status changed
    (started, began running, ended) after ``since``, ``page_size`` a page; every listing page and
    every poll is recorded with the manual clock. ``hidden`` attempts are never listed (a listing
    that misses a change); ``list_errors`` are raised by the next listing calls, one each."""

    def __init__(self, clock: ManualClock, interval: float = 30.0, list_interval: float = 5.0) -> None:
        super().__init__(clock.now, poll_interval_seconds=interval)
        self.manual = clock
        self.list_interval_seconds = list_interval
        self.page_size = 100
        self.hidden: set[AttemptKey] = set()
        self.list_errors: list[BackendError] = []
        self.lists: list[tuple[float, float]] = []
        """(when, since) of every listing page asked for."""
        self.polls: list[tuple[float, AttemptKey]] = []

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        self.polls.append((self.manual.now(), (attempt.job_id, attempt.attempt)))
        return super().poll(attempt)

    def changed_since(self, attempts: Sequence[AttemptSpec], since: float, page: object | None) -> ChangePage:
        self.lists.append((self.manual.now(), since))
        if self.list_errors:
            raise self.list_errors.pop(0)
        now = self.manual.now()
        changed: dict[AttemptKey, ListedChange] = {}
        for attempt in sorted(attempts, key=lambda a: (a.job_id, a.attempt)):
            state = self._load(attempt.key)
            key = (attempt.job_id, attempt.attempt)
            if state is None or key in self.hidden:
                continue
            report = super().poll(attempt)
            moments = [float(state["started_at"]), report.running_since or 0.0, report.ended_at or 0.0]
            modified = max(moment for moment in moments if moment <= now)
            if modified > since:
                status = None if report.status.ended else report.status
                changed[key] = ListedChange(modified, status)
        keys = list(changed)
        offset = page if isinstance(page, int) else 0
        shown = keys[offset : offset + self.page_size]
        following = offset + self.page_size if offset + self.page_size < len(keys) else None
        return ChangePage({key: changed[key] for key in shown}, following)


def started(fake: ListingFake, *job_ids: int, duration: float = 1000.0) -> dict[AttemptKey, AttemptSpec]:
    """Attempts started on ``fake`` now (running at once), as the poller is told of them."""
    out = {}
    for job_id in job_ids:
        attempt = AttemptSpec(
            job_id, f"job-{job_id}", 1, "research", "ml.g5.xlarge", 1, 1, training={"duration": duration}
        )
        fake.start(attempt)
        out[job_id, 1] = attempt
    return out


def run_until(poller: BackendPoller, clock: ManualClock, until: float, step: float = 0.5) -> None:
    """Drive the poller inline, as the step does without threads, up to ``until``."""
    while clock.now() < until:
        clock.advance_to(clock.now() + step)
        poller.poll_due(clock.now())


def finish_at(fake: ListingFake, attempt: AttemptSpec, at: float) -> None:
    """Make the fake attempt end (succeed) at ``at``."""
    state = fake._load(attempt.key)
    assert state is not None
    state["work"] = at - float(state["started_at"])
    fake._save(attempt.key, state)


def test_only_listing_backends_have_the_capability() -> None:
    clock = ManualClock(0.0)
    assert isinstance(SageMakerBackend(region_name="us-east-1"), ListsChanges)
    assert isinstance(ListingFake(clock), ListsChanges)
    assert not isinstance(FakeBackend(clock.now), ListsChanges)
    assert not isinstance(RecordingBackend("plain", clock, 1.0), ListsChanges)


def test_a_change_only_the_listing_shows_is_described_within_the_list_period() -> None:
    """100 running attempts the log knows as RUNNING: none is described until a listing shows a
    change, then only that one, within the list period (5 s), not the poll interval (30 s)."""
    clock = ManualClock(0.0)
    fake = ListingFake(clock)
    attempts = started(fake, *range(1, 101))
    poller = BackendPoller(fake, clock.now, interval=30.0, workers=4)
    clock.advance_to(100.0)
    poller.track(attempts, clock.now(), {key: Known(AttemptStatus.RUNNING, 0.0) for key in attempts})
    poller.poll_due(clock.now())
    assert fake.lists == [(100.0, -60.0)]
    assert fake.polls == [(100.0, (1, 1))], "only the safety net's first describe, spread over 300 s"

    finish_at(fake, attempts[42, 1], 103.2)
    run_until(poller, clock, 115.0)
    described = [(at, key) for at, key in fake.polls if key == (42, 1)]
    assert described and described[0][0] <= 103.2 + 5.0, described
    assert poller.reports()[42, 1].status is AttemptStatus.SUCCEEDED
    assert len(described) == 1, "the same change, listed again in the overlap, is not described twice"
    assert len(fake.lists) == 4  # every 5 s: 100, 105, 110, 115
    assert [since for _, since in fake.lists[1:]] == [40.0, 45.0, 50.0]  # the previous one's start less 60 s
    safety = [key for _, key in fake.polls if key != (42, 1)]
    assert len(safety) == len(set(safety)) <= 1 + 100 * 15 // 300 + 1, safety


def test_a_tracked_attempt_the_listing_misses_is_still_described_by_the_safety_net() -> None:
    clock = ManualClock(0.0)
    fake = ListingFake(clock, interval=30.0)
    attempts = started(fake, 1, 2, 3)
    poller = BackendPoller(fake, clock.now, interval=30.0, workers=4)
    poller.track(attempts, clock.now(), {key: Known(AttemptStatus.RUNNING, 0.0) for key in attempts})
    fake.hidden.add((3, 1))
    finish_at(fake, attempts[3, 1], 10.0)
    run_until(poller, clock, 199.5)
    assert (3, 1) not in poller.reports(), "described before the safety net's time: the test shows nothing"
    run_until(poller, clock, 400.0)
    # its first describe is at 200 s (third of three spread over 300 s), then every 300 s
    assert [at for at, key in fake.polls if key == (3, 1)] == [200.0]
    assert poller.reports()[3, 1].status is AttemptStatus.SUCCEEDED


def test_a_throttled_listing_pauses_every_call_and_starts_again_after_the_pause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(0.0)
    fake = ListingFake(clock)
    attempts = started(fake, *range(1, 11))
    poller = BackendPoller(fake, clock.now, interval=30.0, workers=4)
    poller.track(attempts, clock.now(), {key: Known(AttemptStatus.RUNNING, 0.0) for key in attempts})
    finish_at(fake, attempts[5, 1], 1.0)
    fake.list_errors.append(BackendThrottled("ThrottlingException: Rate exceeded"))
    clock.advance_to(2.0)
    with caplog.at_level(logging.INFO, logger="airflow_quota.scheduler"):
        poller.poll_due(clock.now())  # the listing is throttled: the describes due wait too
        assert [at for at, _ in fake.lists] == [2.0]
        assert fake.polls == []
        clock.advance_to(2.0 + THROTTLE_FIRST_SECONDS / 2)
        poller.poll_due(clock.now())
        assert len(fake.lists) == 1 and fake.polls == [], "a call was made during the pause"
        clock.advance_to(2.0 + THROTTLE_FIRST_SECONDS)
        poller.poll_due(clock.now())
    assert [since for _, since in fake.lists] == [-60.0, -60.0], "the listing starts again from the same moment"
    assert (3.0, (5, 1)) in fake.polls
    assert poller.reports()[5, 1].status is AttemptStatus.SUCCEEDED
    assert any("throttles calls" in r.getMessage() for r in caplog.records)
    assert any("answers again after throttling" in r.getMessage() for r in caplog.records)


def test_a_failing_listing_falls_back_to_describing_every_attempt_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(0.0)
    fake = ListingFake(clock)
    attempts = started(fake, *range(1, 7))
    poller = BackendPoller(fake, clock.now, interval=30.0, workers=4)
    poller.track(attempts, clock.now(), {key: Known(AttemptStatus.RUNNING, 0.0) for key in attempts})
    fake.list_errors += [BackendError("AccessDeniedException: not allowed to list")] * 7
    with caplog.at_level(logging.INFO, logger="airflow_quota.scheduler"):
        run_until(poller, clock, 35.0)
        assert len(fake.lists) == 7  # every 5 s, each failing
        # the six spread over one interval from the first failure (at 0.5 s), then every 30 s
        assert sorted(key for at, key in fake.polls if at < 30.0) == sorted(attempts)
        assert [at for at, key in fake.polls if key == (1, 1)] == [0.5, 30.0]
        run_until(poller, clock, 70.0)  # the listing works again from 35 s: back to the safety net
    assert len([key for at, key in fake.polls if at > 35.0]) <= 6
    messages = [r.getMessage() for r in caplog.records]
    assert sum("could not list its changes" in m and "every 30 s" in m for m in messages) == 1
    assert any("lists its changes again" in m for m in messages)


def test_pages_are_one_call_each_within_the_rate() -> None:
    clock = ManualClock(0.0)
    fake = ListingFake(clock)
    fake.page_size = 2
    attempts = started(fake, *range(1, 6))
    poller = BackendPoller(fake, clock.now, interval=30.0, workers=4, rate=1.0)
    poller.track(attempts, clock.now(), {key: Known(AttemptStatus.PENDING, 0.0) for key in attempts})
    clock.advance_to(1.0)  # all five RUNNING since 0: each listed, PENDING in the log
    for _ in range(60):  # 15 s at 1 call a second: listings go first, then describes
        poller.poll_due(clock.now())
        clock.advance_to(clock.now() + 0.25)
    pages = [at for at, _ in fake.lists]
    asked = sorted(pages + [at for at, _ in fake.polls])
    assert pages[:3] == [1.0, 2.0, 3.0], "three pages of two, one call (one token) each"
    for second in range(int(clock.now()) + 1):
        assert sum(1 for at in asked if second <= at < second + 1) <= 1, asked
    assert {key for _, key in fake.polls} == set(attempts)


def test_a_new_leader_lists_what_changed_while_no_leader_ran_without_describing_everything(
    engine: Engine,
) -> None:
    """Eight jobs run on a listing backend (30 s interval); the leader stops at 100 s, the last
    job placed ends at 150 s, and a new leader takes over at 400 s: it takes the end in within
    one list period, having described that job and the safety net's first one only. Polled per
    attempt (as without the log's known states), the ended job's turn would come 26 s later."""
    clock = ManualClock(0.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(POOL)
    ids = [store.submit(request(f"run-{i}"), "fake", {"duration": 150 if i == 7 else 10_000}).id for i in range(8)]
    fake = ListingFake(clock)
    first = QuotaService(engine, {"fake": fake}, clock=clock)
    while clock.now() < 100.0:
        first.step()
        clock.advance_to(clock.now() + 0.5)
    assert {j.state for j in store.jobs()} == {"RUNNING"}
    first.poller.stop()

    clock.advance_to(400.0)  # the last job ended at 150 s, while no leader ran
    second = QuotaService(engine, {"fake": fake}, clock=clock)
    fake.polls.clear()
    fake.lists.clear()
    second.recover()

    def state(job_id: int) -> str:
        return next(j.state for j in store.jobs() if j.id == job_id)

    second.step()
    while state(ids[7]) == "RUNNING" and clock.now() < 405.0:
        clock.advance_to(clock.now() + 0.5)
        second.step()
    assert state(ids[7]) == "SUCCEEDED" and clock.now() <= 405.0, clock.now()
    assert fake.lists[0] == (400.0, -60.0), "the first listing covers the attempts since they were placed"
    assert sorted(key for _, key in fake.polls) == [(ids[0], 1), (ids[7], 1)], fake.polls


def test_a_listed_change_whose_describe_fails_is_described_again_at_the_next_listing() -> None:
    clock = ManualClock(0.0)
    fake = ListingFake(clock)
    attempts = started(fake, 1, 2)
    poller = BackendPoller(fake, clock.now, interval=30.0, workers=2)
    poller.track(attempts, clock.now(), {key: Known(AttemptStatus.RUNNING, 0.0) for key in attempts})
    finish_at(fake, attempts[2, 1], 1.0)
    failing = {"left": 1}
    describe = fake.poll

    def poll_failing_once(attempt: AttemptSpec) -> AttemptReport:
        if attempt.job_id == 2 and failing["left"]:
            failing["left"] -= 1
            fake.polls.append((clock.now(), (2, 1)))
            raise BackendError("InternalFailure: try again")
        return describe(attempt)

    fake.poll = poll_failing_once  # type: ignore[method-assign]
    run_until(poller, clock, 12.0)
    assert [at for at, key in fake.polls if key == (2, 1)] == [5.5, 10.5], fake.polls  # listed at 5.5 s, 10.5 s
    assert poller.reports()[2, 1].status is AttemptStatus.SUCCEEDED


# -- news for the leader's idle wait -------------------------------------------------------------


class SwitchingBackend(RecordingBackend):
    """Answers ``status`` (RUNNING until a test switches it)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__("switching", clock, 0.0)
        self.status = AttemptStatus.RUNNING

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        super().poll(attempt)
        return AttemptReport(self.status, running_since=0.0)


def test_a_changed_report_and_an_action_that_came_back_are_news_and_nothing_else_is() -> None:
    clock = ManualClock(100.0)
    backend = SwitchingBackend(clock)
    poller = BackendPoller(backend, clock.now, interval=0.0, workers=2)
    news: list[str] = []
    poller.on_news = lambda: news.append(backend.status.value)
    poller.track(specs(1), clock.now())
    poller.poll_due(clock.now())
    assert news == ["RUNNING"], "the first report is news"
    for _ in range(3):
        poller.poll_due(clock.now())
    assert news == ["RUNNING"], "the same report again is not"
    backend.status = AttemptStatus.SUCCEEDED
    poller.poll_due(clock.now())
    assert news == ["RUNNING", "SUCCEEDED"]
    poller.request([BackendAction(ActionKind.START, spec(2))])
    poller.act_due(clock.now())
    assert len(news) == 3 and [o.key for o in poller.take_outcomes()] == [(2, 1)]


def test_the_leader_places_freed_capacity_at_once_not_at_its_next_poll_interval(engine: Engine) -> None:
    """One instance, two queued jobs, the first a 1 s training; the scheduler runs on the wall
    clock with a 60 s poll interval. Its idle wait ends when the poller has news (the start came
    back, the finish was seen), so the second job is placed within seconds of the first ending;
    without those wakes it would wait out the interval."""
    store = QuotaStore(engine)
    store.apply_config(
        {
            "pool": {"capacity": {"ml.g5.xlarge": 1}},
            "shares": [{"name": "research", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "LEND_AND_BORROW"}],
        }
    )
    first = store.submit(request("first"), "fake", {"duration": 1.0})
    second = store.submit(request("second"), "fake", {"duration": 600.0})
    service = QuotaService(engine, {"fake": FakeBackend(WallClock().now)}, poll_seconds=60.0, lease_seconds=30.0)
    stop = threading.Event()
    leader = threading.Thread(target=service.run, args=(stop,))
    leader.start()
    try:
        wait_for(lambda: store.job(second.id).state == "RUNNING", WAIT, "the second job to run")
        rows = {row.name: row for row in store.jobs()}
        assert rows["first"].state == "SUCCEEDED" and rows["second"].state == "RUNNING", rows
        ended = store.attempts(first.id)[-1].ended_at
        placed = store.attempts(second.id)[0].placed_at
        assert ended is not None and placed - ended < 15.0, (ended, placed)
    finally:
        stop.set()
        service.wake()
        leader.join(WAIT)
    assert not leader.is_alive(), "the scheduler did not stop when woken"
