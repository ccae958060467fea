"""QuotaJobSensor and QuotaCapacitySensor: poke through the hook, defer through their triggers,
and the capacity check's arithmetic against the real quota scheduler's placements."""

from __future__ import annotations

import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from airflow_quota.exceptions import InvalidInput
from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.sensors.quota import QuotaCapacitySensor, QuotaJobSensor
from airflow_quota.triggers.quota import DEFER_SETTLE_SECONDS, QuotaCapacityTrigger, QuotaJobTrigger
from tests.airflow.conftest import G5, QuotaWorld
from tests.airflow.task_context import context


def job_sensor(job_id: int | str, **arguments: Any) -> QuotaJobSensor:
    return QuotaJobSensor(task_id="wait", job_id=job_id, poke_interval=0.01, timeout=60, **arguments)


def capacity_sensor(share: str = "prod", **arguments: Any) -> QuotaCapacitySensor:
    arguments.setdefault("instance_preferences", G5)
    return QuotaCapacitySensor(task_id="room", share=share, poke_interval=0.01, timeout=60, **arguments)


def test_the_job_sensor_pokes_until_the_job_is_final(world: QuotaWorld) -> None:
    job = world.submit("train", {"duration": 100})
    sensor = job_sensor(str(job.id))  # rendered from an XCom: a string
    assert sensor.poke(context()) is False
    world.step(1000.0)
    assert sensor.poke(context()) is False
    world.step(1100.0)
    assert sensor.poke(context()) is True


def test_the_job_sensor_fails_with_the_reason_unless_told_not_to(world: QuotaWorld) -> None:
    job = world.submit("crash", {"duration": 100, "failures": [{"after": 5, "reason": "ExitCode:3"}]})
    world.step(1000.0)
    world.step(1100.0)
    with pytest.raises(AirflowException, match="failed: ATTEMPTS_EXHAUSTED: ExitCode:3"):
        job_sensor(job.id).poke(context())
    assert job_sensor(job.id, fail_on_job_failure=False).poke(context()) is True


def test_the_job_sensor_defers_with_a_trigger_that_never_cancels(world: QuotaWorld) -> None:
    job = world.submit("train", {"duration": 100})
    before = time.time()
    with pytest.raises(TaskDeferred) as deferral:
        job_sensor(job.id).execute(context())
    after = time.time()
    trigger = deferral.value.trigger
    assert isinstance(trigger, QuotaJobTrigger)
    kwargs = trigger.serialize()[1]
    assert before + DEFER_SETTLE_SECONDS <= kwargs.pop("fire_not_before") <= after + DEFER_SETTLE_SECONDS
    assert kwargs == {
        "job_id": job.id,
        "quota_conn_id": "quota_default",
        "poll_interval": 0.01,
        "cancel_on_kill": False,
        "print_log": False,  # the sensor watches a job another task owns
        "aws_conn_id": None,
        "give_up_at": None,
    }
    assert deferral.value.timeout is not None and deferral.value.timeout.total_seconds() == 60


@pytest.mark.parametrize(
    ("event", "outcome"),
    [
        ({"status": "success", "job_id": 1, "state": "SUCCEEDED", "reason": None, "message": "done"}, None),
        (
            {"status": "failed", "job_id": 1, "state": "FAILED", "reason": "PENDING_TIMEOUT", "message": "late"},
            "quota job 1 failed: PENDING_TIMEOUT",
        ),
        (
            {"status": "error", "job_id": 1, "state": None, "reason": None, "message": "no quota job 1"},
            "no quota job 1",
        ),
        (None, "unexpected event"),
    ],
    ids=["succeeded", "failed with a reason", "could not be followed", "no event"],
)
def test_the_job_sensor_resumes_from_the_event(world: QuotaWorld, event: Any, outcome: str | None) -> None:
    sensor = job_sensor(1)
    if outcome is None:
        sensor.execute_complete(context(), event)
    else:
        with pytest.raises(AirflowException, match=outcome):
            sensor.execute_complete(context(), event)


def test_a_job_sensor_on_a_missing_job_fails(world: QuotaWorld) -> None:
    with pytest.raises(AirflowException, match="there is no quota job 99"):
        job_sensor(99).poke(context())
    with pytest.raises(AirflowException, match="job_id must be a quota job's id"):
        job_sensor("{{ oops }}").poke(context())


def test_the_capacity_sensor_sees_room_come_and_go(world: QuotaWorld) -> None:
    sensor = capacity_sensor("prod")
    assert sensor.poke(context()) is True
    world.submit("hog1", {"duration": 100})
    world.submit("hog2", {"duration": 100})  # borrows prod's idle instance
    world.step(1000.0)
    assert sensor.poke(context()) is False  # the pool is full: prod would have to reclaim
    world.step(1100.0)
    assert sensor.poke(context()) is True


@pytest.mark.parametrize(
    ("share", "preferences", "placeable", "reason"),
    [
        ("prod", G5, True, "1x ml.g5.xlarge fits now, within the share's limit"),
        (
            "prod",
            [{"instance_type": "ml.g5.xlarge", "count": 2}],
            False,
            "2x ml.g5.xlarge: over the share's limit; at most 1 now",
        ),
        (
            "research",
            [{"instance_type": "ml.g5.xlarge", "count": 2}],
            True,
            "2x ml.g5.xlarge fits now, within quota or by borrowing",
        ),
        ("research", [{"instance_type": "ml.p4d.24xlarge", "count": 1}], False, "1x ml.p4d.24xlarge: not in the pool"),
        ("nobody", G5, False, "no share named 'nobody'"),
    ],
    ids=[
        "a LEND share within its limit",
        "a LEND share never goes over its limit",
        "a LEND_AND_BORROW share borrows the idle instance",
        "a type the pool does not have",
        "an unknown share",
    ],
)
def test_can_place_now(
    world: QuotaWorld, share: str, preferences: list[dict[str, Any]], placeable: bool, reason: str
) -> None:
    check = QuotaHook().can_place_now(share, preferences)
    assert (check.placeable, check.reason) == (placeable, reason)


def test_the_capacity_check_is_the_schedulers_answer_at_its_last_commit(world: QuotaWorld) -> None:
    """The hook answers from the leader's view: a submission counts once the quota scheduler
    has taken it in, and then the answer is the core's placement check."""
    world.submit("mine", {"duration": 1000})
    world.step(1000.0)
    assert QuotaHook().can_place_now("research", G5).placeable is True  # by borrowing prod's idle g5
    world.submit("theirs", {"duration": 10}, share="prod")
    assert QuotaHook().can_place_now("research", G5).placeable is True  # not taken in yet
    world.step(1000.0)  # prod's job takes prod's own idle instance
    check = QuotaHook().can_place_now("research", G5)
    assert (check.placeable, check.reason) == (False, "1x ml.g5.xlarge: pool capacity in use; at most 0 now")


def test_the_capacity_sensor_defers_and_resumes(world: QuotaWorld) -> None:
    world.submit("hog1", {"duration": 100})
    world.submit("hog2", {"duration": 100}, share="prod")
    world.step(1000.0)
    with pytest.raises(TaskDeferred) as deferral:
        capacity_sensor("prod").execute(context())
    trigger = deferral.value.trigger
    assert isinstance(trigger, QuotaCapacityTrigger)
    assert trigger.serialize()[1]["instance_preferences"] == G5
    capacity_sensor("prod").execute_complete(context(), {"status": "success", "message": "fits"})
    with pytest.raises(AirflowException, match="capacity check failed: unreadable"):
        capacity_sensor("prod").execute_complete(context(), {"status": "error", "message": "unreadable"})


def test_a_bad_preference_list_fails_the_capacity_sensor_at_parse_time() -> None:
    with pytest.raises(
        InvalidInput, match=r"instance_preferences\[0\].count: Input should be greater than or equal to 1"
    ):
        capacity_sensor(instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 0}])


def test_max_attempts_bounds_the_sensors_timeout_as_the_amazon_sensors_do(world: QuotaWorld) -> None:
    """``poke_interval x max_attempts`` seconds at most, deferred (the deferral's timeout) or not."""
    job = world.submit("train", {"duration": 100})
    sensor = QuotaJobSensor(task_id="wait", job_id=job.id, poke_interval=2, max_attempts=30, timeout=3600)
    assert sensor.timeout == 60
    with pytest.raises(TaskDeferred) as deferral:
        sensor.execute(context())
    assert deferral.value.timeout is not None and deferral.value.timeout.total_seconds() == 60
    assert QuotaJobSensor(task_id="wait", job_id=job.id, poke_interval=2, timeout=30, max_attempts=30).timeout == 30
    with pytest.raises(InvalidInput, match="max_attempts: must be a whole number of looks"):
        QuotaCapacitySensor(task_id="room", share="prod", instance_preferences=G5, max_attempts=0)
