"""QuotaJobTrigger and QuotaCapacityTrigger: serialisation round trips, and run() against a real
SQLite quota database whose jobs the real quota scheduler drives."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from airflow.triggers.base import BaseTrigger, TriggerEvent
from sqlalchemy import select

from airflow_quota.store.models import JobRow, Request
from airflow_quota.triggers.quota import QuotaCapacityTrigger, QuotaJobEvent, QuotaJobTrigger
from tests.airflow.conftest import G5, QuotaWorld, events_of

TRIGGERS: list[BaseTrigger] = [
    QuotaJobTrigger(job_id=7, quota_conn_id="quota_default", poll_interval=5.0),
    QuotaJobTrigger(job_id=8, quota_conn_id="other", poll_interval=0.5, cancel_on_kill=True),
    QuotaCapacityTrigger(share="research", instance_preferences=G5, quota_conn_id="quota_default", poll_interval=2),
]


@pytest.mark.parametrize("trigger", TRIGGERS, ids=["job trigger", "owning job trigger", "capacity trigger"])
def test_serialize_round_trips(trigger: BaseTrigger) -> None:
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    assert cls is type(trigger)
    assert cls(**kwargs).serialize() == (classpath, kwargs)


def test_kwargs_are_plain_json() -> None:
    import json

    for trigger in TRIGGERS:
        _, kwargs = trigger.serialize()
        assert json.loads(json.dumps(kwargs)) == kwargs


async def _follow(world: QuotaWorld, trigger: QuotaJobTrigger, moments: list[float]) -> list[TriggerEvent]:
    """Run the trigger while the quota scheduler steps through ``moments``."""

    async def drive() -> None:
        for at in moments:
            await asyncio.sleep(0.05)
            await asyncio.to_thread(world.step, at)

    events, _ = await asyncio.gather(events_of(trigger.run()), drive())
    return events


def _payload(event: TriggerEvent) -> dict[str, Any]:
    payload = event.payload
    assert isinstance(payload, dict)
    return payload


def logged(capsys: pytest.CaptureFixture[str], needle: str) -> list[str]:
    """The messages logged so far that contain ``needle`` (Airflow's structlog renders a
    trigger's log lines on standard output: timestamp, level, message, logger)."""
    messages = []
    for line in capsys.readouterr().out.splitlines():
        if needle in line and "[info" in line:
            message = line.split("] ", 1)[1]
            messages.append(message.rsplit(" [", 1)[0])
    return messages


def test_a_job_followed_to_success_gives_one_event_and_logs_each_change(
    world: QuotaWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    job = world.submit("train", {"duration": 100, "startup": 10})
    trigger = QuotaJobTrigger(job_id=job.id, quota_conn_id="quota_default", poll_interval=0.01)
    events = asyncio.run(_follow(world, trigger, [1000.0, 1020.0, 1200.0]))
    assert [_payload(e) for e in events] == [
        {
            "status": "success",
            "job_id": job.id,
            "state": "SUCCEEDED",
            "reason": None,
            "message": f"quota job {job.id} (train) in share research SUCCEEDED after 1 attempt(s), 0 preemption(s)",
        }
    ]
    assert logged(capsys, f"quota job {job.id} (train)") == [
        f"quota job {job.id} (train) in share research is SUBMITTED: waiting for the quota scheduler to take it in",
        f"quota job {job.id} (train) in share research is SCHEDULED on 1x ml.g5.xlarge, attempt 1",
        f"quota job {job.id} (train) in share research is RUNNING on 1x ml.g5.xlarge, attempt 1",
        f"quota job {job.id} (train) in share research SUCCEEDED after 1 attempt(s), 0 preemption(s)",
    ]


def test_a_waiting_job_logs_its_reason_and_position(world: QuotaWorld, capsys: pytest.CaptureFixture[str]) -> None:
    world.submit("hog1", {"duration": 100})
    world.submit("hog2", {"duration": 100}, share="prod")
    world.step()
    late = world.submit("late", {"duration": 10})
    trigger = QuotaJobTrigger(job_id=late.id, quota_conn_id="quota_default", poll_interval=0.01)
    events = asyncio.run(_follow(world, trigger, [1001.0, 1100.0, 1101.0, 1200.0]))
    assert _payload(events[0])["status"] == "success"
    messages = logged(capsys, f"quota job {late.id} (late)")
    waiting = f"quota job {late.id} (late) in share research is RUNNABLE: WAITING_FOR_QUOTA for 1x ml.g5.xlarge"
    assert any(m.startswith(waiting) and "position 1 in its share" in m for m in messages), messages


def test_a_failed_job_gives_a_failed_event_with_its_reason(world: QuotaWorld) -> None:
    job = world.submit("crash", {"duration": 100, "failures": [{"after": 5, "reason": "ExitCode:3"}]})
    trigger = QuotaJobTrigger(job_id=job.id, quota_conn_id="quota_default", poll_interval=0.01)
    events = asyncio.run(_follow(world, trigger, [1000.0, 1100.0]))
    assert len(events) == 1
    event = QuotaJobEvent.from_payload(events[0].payload)
    assert (event.status, event.state, event.reason) == ("failed", "FAILED", "ATTEMPTS_EXHAUSTED")
    assert "ExitCode:3: attempt 1 of 1 failed" in event.message


def test_running_twice_writes_nothing_and_gives_the_same_event(world: QuotaWorld) -> None:
    job = world.submit("done", {"duration": 10})
    world.step()
    world.step(1100.0)
    before = (world.store.pending_requests(), len(world.store.events()))
    trigger = QuotaJobTrigger(job_id=job.id, quota_conn_id="quota_default", poll_interval=0.01)
    first = asyncio.run(events_of(trigger.run()))
    second = asyncio.run(events_of(QuotaJobTrigger(**trigger.serialize()[1]).run()))
    assert [e.payload for e in first] == [e.payload for e in second]
    assert (world.store.pending_requests(), len(world.store.events())) == before


def test_a_broken_database_gives_an_error_event_not_an_exception(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_BROKEN", f"sqlite:///{tmp_path}/no/such/dir/quota.db")
    trigger = QuotaJobTrigger(job_id=1, quota_conn_id="quota_broken", poll_interval=0.01)
    events = asyncio.run(events_of(trigger.run()))
    assert len(events) == 1
    payload = _payload(events[0])
    assert payload["status"] == "error" and payload["job_id"] == 1
    assert "the quota database stayed unreadable" in payload["message"]


def test_a_job_the_scheduler_refused_gives_an_error_event_naming_why(world: QuotaWorld) -> None:
    job = world.submit("doomed", {"duration": 10})
    # What the scheduler writes when it refuses a submission the store had accepted (a race with
    # a configuration change): the request keeps the reason, the job's row goes.
    with world.store.sessions() as session, session.begin():
        inbox = session.scalars(select(Request).where(Request.job_id == job.id)).one()
        inbox.handled, inbox.outcome, inbox.error = True, "refused", "share: share 'research' is DISABLED"
        session.delete(session.get(JobRow, job.id))
    events = asyncio.run(events_of(QuotaJobTrigger(job_id=job.id, poll_interval=0.01).run()))
    assert [_payload(e) for e in events] == [
        {
            "status": "error",
            "job_id": job.id,
            "state": None,
            "reason": None,
            "message": f"the quota scheduler refused quota job {job.id}: share: share 'research' is DISABLED",
        }
    ]


def test_on_kill_cancels_only_a_job_the_task_owns(world: QuotaWorld) -> None:
    job = world.submit("owned", {"duration": 100})
    before = world.store.pending_requests()
    asyncio.run(QuotaJobTrigger(job_id=job.id, poll_interval=0.01).on_kill())
    assert world.store.pending_requests() == before  # a sensor's trigger leaves the job alone
    asyncio.run(QuotaJobTrigger(job_id=job.id, poll_interval=0.01, cancel_on_kill=True).on_kill())
    world.step()
    assert (world.job(job.id).state, world.job(job.id).reason) == ("FAILED", "CANCELLED")


def test_the_capacity_trigger_fires_once_the_share_could_place(world: QuotaWorld) -> None:
    world.submit("hog1", {"duration": 100})
    world.submit("hog2", {"duration": 100}, share="prod")
    world.step()
    trigger = QuotaCapacityTrigger(share="prod", instance_preferences=G5, poll_interval=0.01)

    async def scenario() -> list[TriggerEvent]:
        async def drive() -> None:
            await asyncio.sleep(0.1)
            await asyncio.to_thread(world.step, 1100.0)

        events, _ = await asyncio.gather(events_of(trigger.run()), drive())
        return events

    events = asyncio.run(scenario())
    assert [_payload(e) for e in events] == [
        {
            "status": "success",
            "share": "prod",
            "entry": "1x ml.g5.xlarge",
            "message": "1x ml.g5.xlarge fits now, within the share's limit",
        }
    ]


def test_the_task_log_shows_each_alert_of_its_job_once(world: QuotaWorld, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.airflow.conftest import QUOTA

    starving_soon = {**QUOTA, "shares": [{**QUOTA["shares"][0], "starvation_after_seconds": 60}, QUOTA["shares"][1]]}
    world.store.apply_config(starving_soon)
    world.submit("hog1", {"duration": 1000})
    world.submit("hog2", {"duration": 1000}, share="prod")
    world.step()
    late = world.submit("late", {"duration": 10})
    trigger = QuotaJobTrigger(job_id=late.id, quota_conn_id="quota_default", poll_interval=0.01)
    events = asyncio.run(_follow(world, trigger, [1001.0, 1062.0, 1063.0, 1500.0, 2001.0, 2002.0, 2020.0]))
    assert _payload(events[0])["status"] == "success"
    captured = capsys.readouterr()
    warnings = [  # the trigger's lines (the quota scheduler runs in this process too, and logs the alert itself)
        line.split("] ", 1)[1].rsplit(" [", 1)[0]
        for line in (captured.out + captured.err).splitlines()
        if "[warning" in line and "QuotaJobTrigger]" in line
    ]
    assert warnings == [
        f"quota alert STARVING: job {late.id} (late) in share research: RUNNABLE for 61 s, position 1 in its share"
    ]
