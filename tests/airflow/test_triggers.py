"""QuotaJobTrigger and QuotaCapacityTrigger: serialisation round trips, and run() against a real
SQLite quota database whose jobs the real quota scheduler drives."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Collection, MutableMapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
import structlog.testing
from airflow.triggers.base import BaseTrigger, TriggerEvent
from sqlalchemy import Engine, select

from airflow_quota.exceptions import DatabaseUnavailable
from airflow_quota.hooks.quota import describe_pending_deadline, pending_deadline_line, store_for
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import AlertRow, JobRow, Request
from airflow_quota.store.repository import QuotaStore
from airflow_quota.triggers import quota as trigger_module
from airflow_quota.triggers.quota import QuotaCapacityTrigger, QuotaJobEvent, QuotaJobTrigger, scheduler_silence
from airflow_quota.triggers.watch import JobWatch
from tests.airflow.conftest import G5, QUOTA, QuotaWorld, events_of, payload_of, request
from tests.builders import write_forecast
from tests.statements import statements_run
from tests.waiting import wait_for_async

TRIGGERS: list[BaseTrigger] = [
    QuotaJobTrigger(job_id=7, quota_conn_id="quota_default", poll_interval=5.0),
    QuotaJobTrigger(job_id=8, quota_conn_id="other", poll_interval=0.5, cancel_on_kill=True),
    QuotaJobTrigger(job_id=9, give_up_at=1_900_000_000.0, fire_not_before=1_800_000_000.0),
    QuotaCapacityTrigger(share="research", instance_preferences=G5, quota_conn_id="quota_default", poll_interval=2),
]


@pytest.mark.parametrize(
    "trigger", TRIGGERS, ids=["job trigger", "owning job trigger", "held job trigger", "capacity trigger"]
)
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
    """Run the trigger while the quota scheduler steps through ``moments``. Before each step
    the trigger has seen what the step before left: its watch has read twice since (a read
    in progress during the step may have begun before it), unless the trigger has ended."""
    following = asyncio.ensure_future(events_of(trigger.run()))

    def rounds() -> int:
        watches = JobWatch.running()
        return watches[0].rounds if watches else 0

    for at in moments:
        target = rounds() + 2

        def read_twice_more(target: int = target) -> bool:
            return following.done() or rounds() >= target

        await wait_for_async(read_twice_more, what=f"the trigger to read the state before {at}")
        await asyncio.to_thread(world.step, at)
    return await following


def logged(capsys: pytest.CaptureFixture[str], needle: str) -> list[str]:
    """The messages logged so far that contain ``needle`` (Airflow's structlog renders a
    trigger's log lines on standard output: timestamp, level, message, logger)."""
    messages = []
    for line in capsys.readouterr().out.splitlines():
        if needle in line and "[info" in line:
            message = line.split("] ", 1)[1]
            messages.append(message.rsplit(" [", 1)[0])
    return messages


def trigger_lines(capsys: pytest.CaptureFixture[str], lines: list[str]) -> Callable[[str], int]:
    """A counter of the ``QuotaJobTrigger``'s log lines holding a needle: each call adds what was
    captured since the last one to ``lines`` and counts over all of them."""

    def said(needle: str) -> int:
        captured = capsys.readouterr()
        lines.extend((captured.out + captured.err).splitlines())
        return sum(1 for line in lines if needle in line and "QuotaJobTrigger]" in line)

    return said


def test_a_job_followed_to_success_gives_one_event_and_logs_each_change(
    world: QuotaWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    job = world.submit("train", {"duration": 100, "startup": 10})
    trigger = QuotaJobTrigger(job_id=job.id, quota_conn_id="quota_default", poll_interval=0.01)
    events = asyncio.run(_follow(world, trigger, [1000.0, 1020.0, 1200.0]))
    assert [payload_of(e) for e in events] == [
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
    assert payload_of(events[0])["status"] == "success"
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


def test_a_job_that_ends_at_once_fires_once_airflow_took_in_the_deferral(world: QuotaWorld) -> None:
    """``fire_not_before``: a job already final when its task defers fires no sooner (Airflow
    3.3 fails a resumed task whose deferring try's exit it drains late: DEFER_SETTLE_SECONDS);
    one without it fires at once."""
    job = world.submit("quick", {"duration": 10})
    world.step()
    world.step(1100.0)
    at_once = QuotaJobTrigger(job_id=job.id, quota_conn_id="quota_default", poll_interval=0.01)
    started = time.monotonic()
    asyncio.run(events_of(at_once.run()))
    immediate = time.monotonic() - started
    held = QuotaJobTrigger(**{**at_once.serialize()[1], "fire_not_before": time.time() + 1.5})
    started = time.monotonic()
    events = asyncio.run(events_of(held.run()))
    assert time.monotonic() - started >= 1.5 > immediate
    assert [payload_of(e)["status"] for e in events] == ["success"]


def test_a_broken_database_gives_an_error_event_not_an_exception(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_BROKEN", f"sqlite:///{tmp_path}/no/such/dir/quota.db")
    trigger = QuotaJobTrigger(job_id=1, quota_conn_id="quota_broken", poll_interval=0.01)
    events = asyncio.run(events_of(trigger.run()))
    assert len(events) == 1
    payload = payload_of(events[0])
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
    assert [payload_of(e) for e in events] == [
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

    async def scenario(said: list[MutableMapping[str, Any]]) -> list[TriggerEvent]:
        following = asyncio.ensure_future(events_of(trigger.run()))
        await wait_for_async(
            lambda: any("cannot place the list yet" in str(line) for line in said), what="the first check"
        )
        assert not following.done()  # it waits while the share cannot place
        await asyncio.to_thread(world.step, 1100.0)
        return await following

    with structlog.testing.capture_logs() as said:
        events = asyncio.run(scenario(said))
    assert [payload_of(e) for e in events] == [
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
    world.submit("hog1", {"duration": 30})
    world.submit("hog2", {"duration": 1000}, share="prod")
    world.step()
    pair = [{"instance_type": "ml.g5.xlarge", "count": 2}]
    late = world.submit("late", {"duration": 10}, preferences=pair)
    world.submit("small", {"duration": 10})  # placed when hog1 ends: it overtakes late
    trigger = QuotaJobTrigger(job_id=late.id, quota_conn_id="quota_default", poll_interval=0.01)
    events = asyncio.run(_follow(world, trigger, [1001.0, 1062.0, 1063.0, 1500.0, 2001.0, 2002.0, 2020.0]))
    assert payload_of(events[0])["status"] == "success"
    captured = capsys.readouterr()
    warnings = [  # the trigger's lines (the quota scheduler runs in this process too, and logs the alert itself)
        line.split("] ", 1)[1].rsplit(" [", 1)[0]
        for line in (captured.out + captured.err).splitlines()
        if "[warning" in line and "QuotaJobTrigger]" in line and "quota alert" in line
    ]
    assert warnings == [
        f"quota alert STARVING: job {late.id} (late) in share research: RUNNABLE for 61 s, "
        "past its threshold of 60 s (starvation_after_seconds); overtaken by 1 later placement, "
        "latest small (research), position 1 in its share"
    ]


def test_a_waiting_task_warns_once_while_no_quota_scheduler_runs_and_says_when_one_does(
    world: QuotaWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    """The test's quota scheduler steps by hand and never beats, so it counts as stopped until
    it takes the lease (as ``airflow-quota scheduler`` does when it starts)."""
    world.submit("hog1", {"duration": 1000})
    world.submit("hog2", {"duration": 1000}, share="prod")
    world.step()
    late = world.submit("late", {"duration": 10})
    trigger = QuotaJobTrigger(job_id=late.id, quota_conn_id="quota_default", poll_interval=0.01)
    lines: list[str] = []
    said = trigger_lines(capsys, lines)

    down = f"no quota scheduler is running (none has ever run on this quota database): quota job {late.id} waits"
    back = f"a quota scheduler runs again ({world.service.holder}): quota job {late.id} is scheduled again"

    async def scenario() -> list[TriggerEvent]:
        task = asyncio.create_task(events_of(trigger.run(), timeout=60))
        await wait_for_async(lambda: said(down) == 1, what="the warning")
        await asyncio.to_thread(world.step, 1001.0)  # taken in while the warning stands: no second one
        await wait_for_async(lambda: said("is RUNNABLE") == 1, what="the job's change")
        assert await asyncio.to_thread(world.service.lock.acquire)  # a quota scheduler leads and beats
        await wait_for_async(lambda: said(back) == 1, what="the all-clear")
        for at in (2001.0, 2011.0):  # hog1 ends, late runs and ends
            await asyncio.to_thread(world.step, at)
        return await task

    events = asyncio.run(scenario())
    assert payload_of(events[0])["status"] == "success"
    assert said(down) == 1 and said(back) == 1
    assert [line for line in lines if "no quota scheduler" in line and "[warning" in line] != []


@pytest.mark.parametrize(
    ("silent_seconds", "said"),
    [
        pytest.param(None, "none has ever run on this quota database", id="never led"),
        pytest.param(750.0, "none has beaten for about 13 minutes, since 14:07 UTC", id="silent a while"),
    ],
)
def test_the_warning_says_how_long_the_quota_scheduler_has_been_silent(silent_seconds: float | None, said: str) -> None:
    now = pendulum.datetime(2026, 12, 3, 14, 20).timestamp()
    assert scheduler_silence(silent_seconds, now) == said


# -- when max_pending_time falls due ----------------------------------------------------------

DEC_3_14_20 = pendulum.datetime(2026, 12, 3, 14, 20).timestamp()


@pytest.mark.parametrize(
    ("limit", "deadline", "said"),
    [
        pytest.param(
            7200,
            DEC_3_14_20 + 7200,
            "quota job 7: max_pending_time 2 hours: it fails with PENDING_TIMEOUT at 16:20 UTC (in 2 hours)"
            " if it is still waiting then",
            id="a wait that just began",
        ),
        pytest.param(
            6 * 3600,
            DEC_3_14_20 + 5 * 3600 + 1800,
            "quota job 7: max_pending_time 6 hours: it fails with PENDING_TIMEOUT at 19:50 UTC"
            " (in 5 hours 30 minutes) if it is still waiting then",
            id="a wait kept across a capacity error: less left than the limit",
        ),
        pytest.param(
            3600,
            DEC_3_14_20 + 86400 + 3600,
            "quota job 7: max_pending_time 1 hour: it fails with PENDING_TIMEOUT at 2026-12-04 15:20 UTC"
            " (in 1 day 1 hour) if it is still waiting then (the wait counts from its training plans' window)",
            id="plan entries only: from the window, another day",
        ),
        pytest.param(
            60,
            DEC_3_14_20 - 5,
            "quota job 7: max_pending_time 1 minute: it fails with PENDING_TIMEOUT at 14:19 UTC (now)"
            " if it is still waiting then",
            id="overdue: the quota scheduler has not failed it yet",
        ),
    ],
)
def test_the_deadline_line_says_when_in_utc_and_from_now_in_words(limit: float, deadline: float, said: str) -> None:
    assert pending_deadline_line(7, limit, deadline, DEC_3_14_20) == said


def test_only_a_runnable_job_with_a_deadline_has_a_deadline_line(world: QuotaWorld) -> None:
    world.submit("hog1", {"duration": 1000})
    world.submit("hog2", {"duration": 1000}, share="prod")
    limited = world.submit("limited", max_pending_seconds=600)
    unlimited = world.submit("unlimited")
    assert describe_pending_deadline(world.job(limited.id), 1000.0) is None  # SUBMITTED: no deadline yet
    world.step(1001.0)
    assert describe_pending_deadline(world.job(unlimited.id), 1001.0) is None
    assert describe_pending_deadline(world.job(limited.id), 1001.0) == (
        f"quota job {limited.id}: max_pending_time 10 minutes: it fails with PENDING_TIMEOUT at 00:26 UTC"
        " (in 10 minutes) if it is still waiting then"
    )
    assert describe_pending_deadline(world.job(world.submit("gone").id), 1001.0) is None


def test_a_waiting_task_logs_once_when_its_max_pending_time_falls_due(
    world: QuotaWorld, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16: the task log says when the wait ends, once per wait, however often the job's
    position changes meanwhile. The trigger reads the wall clock; here that is the world's."""
    monkeypatch.setattr(trigger_module, "time", SimpleNamespace(time=world.clock.now))
    world.submit("hog1", {"duration": 1000})
    world.submit("hog2", {"duration": 1000}, share="prod")
    world.step()
    late = world.submit("late", {"duration": 10}, max_pending_seconds=3600)
    trigger = QuotaJobTrigger(job_id=late.id, quota_conn_id="quota_default", poll_interval=0.01)
    lines: list[str] = []
    said = trigger_lines(capsys, lines)

    due = (
        f"quota job {late.id}: max_pending_time 1 hour: it fails with PENDING_TIMEOUT at 01:16 UTC (in 1 hour)"
        " if it is still waiting then"
    )
    behind = (
        f"quota job {late.id} (late) in share research is RUNNABLE: WAITING_FOR_QUOTA for 1x ml.g5.xlarge, position 2"
    )

    async def scenario() -> list[TriggerEvent]:
        task = asyncio.create_task(events_of(trigger.run(), timeout=60))
        await asyncio.to_thread(world.step, 1001.0)  # taken in: RUNNABLE until 4601 at most
        await wait_for_async(lambda: said(due) == 1, what="the deadline's line")
        world.submit("urgent", {"duration": 10}, priority=10)
        await asyncio.to_thread(world.step, 1002.0)  # urgent goes ahead: late is second
        await wait_for_async(lambda: said(behind) == 1, what="the job's new position")
        for at in (2001.0, 2011.0):  # the hogs end, urgent and late run and end
            await asyncio.to_thread(world.step, at)
        return await task

    events = asyncio.run(scenario())
    assert payload_of(events[0])["status"] == "success"
    assert said(due) == 1 and said("max_pending_time") == 1


def test_a_waiting_task_logs_its_forecast_and_again_only_when_it_moves(
    world: QuotaWorld, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: the task log says when its job is expected to start (``quota_forecasts``, as the
    quota scheduler writes it), and again when the forecast moves by more than 10% of the wait
    it had left, not for a smaller move. The rows are written here by hand, so the moves are known."""
    monkeypatch.setattr(trigger_module, "time", SimpleNamespace(time=world.clock.now))
    world.submit("hog1", {"duration": 5000})
    world.submit("hog2", {"duration": 5000}, share="prod")
    world.step()
    late = world.submit("late", {"duration": 10})
    trigger = QuotaJobTrigger(job_id=late.id, quota_conn_id="quota_default", poll_interval=0.01)
    lines: list[str] = []
    said = trigger_lines(capsys, lines)

    def forecast(start: float) -> None:
        write_forecast(world.engine, late.id, world.clock.now(), start, 600, "task history")

    async def scenario() -> list[TriggerEvent]:
        task = asyncio.create_task(events_of(trigger.run(), timeout=60))
        await asyncio.to_thread(world.step, 1001.0)  # taken in: RUNNABLE behind hog1
        forecast(1001.0 + 3600)
        await wait_for_async(lambda: said("expected to start around") == 1, what="the forecast's first line")
        forecast(1001.0 + 3600 + 120)  # moved by 2 minutes of an hour: not worth a line
        forecast(1001.0 + 3600 + 1800)  # moved by half an hour: a line
        await wait_for_async(lambda: said("expected to start around") == 2, what="the moved forecast's line")
        for at in (6001.0, 6011.0):  # the hogs end, late runs and ends
            await asyncio.to_thread(world.step, at)
        return await task

    events = asyncio.run(scenario())
    assert payload_of(events[0])["status"] == "success"
    assert said("expected to start around") == 2
    assert said("expected to start around 01:16 UTC, likely 01:06 UTC to 01:26 UTC on 1x ml.g5.xlarge") == 1
    assert said("expected to start around 01:46 UTC, likely 01:36 UTC to 01:56 UTC on 1x ml.g5.xlarge") == 1


# -- one reader per triggerer: JobWatch -------------------------------------------------------


def counting_selects(engine: Engine) -> AbstractContextManager[list[str]]:
    """The SELECT statements run on ``engine`` inside the block."""
    return statements_run(engine, lambda statement: statement.lstrip().upper().startswith("SELECT"))


def _start(*triggers: QuotaJobTrigger) -> list[asyncio.Task[list[TriggerEvent]]]:
    return [asyncio.create_task(events_of(trigger.run(), timeout=60)) for trigger in triggers]


async def _cancel(tasks: list[asyncio.Task[list[TriggerEvent]]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _stopped(task: asyncio.Task[None] | None) -> bool:
    """Whether a watch's task ends (it was cancelled and must get the loop to finish)."""
    assert task is not None
    await asyncio.wait([task], timeout=2)
    return task.done()


def test_many_job_triggers_share_one_reader_whose_queries_do_not_grow_with_them(world: QuotaWorld) -> None:
    jobs = [world.submit(f"wait-{i}", {"duration": 100}).id for i in range(200)]
    engine = store_for(world.url).engine
    interval, window = 0.05, 1.0

    async def follow(count: int) -> tuple[int, int]:
        """(SELECTs, reads) during ``window`` seconds while ``count`` triggers wait."""
        tasks = _start(*(QuotaJobTrigger(job_id=job_id, poll_interval=interval) for job_id in jobs[:count]))
        await wait_for_async(  # all joined (a loaded machine may take a while)
            lambda: [w.watching for w in JobWatch.running()] == [count],
            20,
            lambda: f"{count} triggers to join one watch (watches: {JobWatch.running()})",
        )
        (watch,) = JobWatch.running()
        settled = watch.rounds + 2  # and their first reads are behind them
        await wait_for_async(
            lambda: watch.rounds >= settled, 20, what=f"two more rounds of the watch of {count} triggers"
        )
        with counting_selects(engine) as selects:
            rounds = watch.rounds
            await asyncio.sleep(window)
            rounds = watch.rounds - rounds
        task = watch.task
        await _cancel(tasks)
        assert await _stopped(task) and JobWatch.running() == []
        return len(selects), rounds

    async def scenario() -> tuple[tuple[int, int], tuple[int, int]]:
        return await follow(1), await follow(200)

    (one, one_rounds), (many, many_rounds) = asyncio.run(scenario())
    most = 3 * (window / interval + 2)  # a job query, an alert query and the heartbeat per interval
    assert one <= 3 * (one_rounds + 1) and many <= 3 * (many_rounds + 1), (one, one_rounds, many, many_rounds)
    assert 0 < one <= most and 0 < many <= most, (one, many)  # alone, each trigger made 2 a round: 8000


def test_a_trigger_is_woken_within_one_interval_of_its_jobs_change(world: QuotaWorld) -> None:
    quick = world.submit("quick", {"duration": 10})
    world.submit("hog", {"duration": 1000}, share="prod")
    waiting = [world.submit(f"wait-{i}", {"duration": 1000}).id for i in range(30)]
    world.step()
    assert world.job(quick.id).state == "SCHEDULED"
    interval = 0.5

    async def scenario() -> float:
        tasks = _start(*(QuotaJobTrigger(job_id=job_id, poll_interval=interval) for job_id in waiting))
        (mine,) = _start(QuotaJobTrigger(job_id=quick.id, poll_interval=interval))
        await wait_for_async(
            lambda: [(w.watching, w.rounds > 0) for w in JobWatch.running()] == [(31, True)],
            what="the 31 triggers to join one watch and its first round",
        )
        await asyncio.to_thread(world.step, 1001.0)  # RUNNING
        await asyncio.to_thread(world.step, 1020.0)  # SUCCEEDED
        changed = time.monotonic()
        events = await mine
        noticed = time.monotonic() - changed
        assert payload_of(events[0])["status"] == "success"
        await _cancel(tasks)
        return noticed

    assert asyncio.run(scenario()) <= interval + 0.3


def test_only_the_subscriptions_whose_job_changed_are_woken(world: QuotaWorld) -> None:
    jobs = [world.submit(f"job-{i}", {"duration": 100}).id for i in range(5)]
    changed, unchanged = jobs[0], jobs[1:]

    async def scenario() -> None:
        watch = JobWatch.for_url(world.url)
        subscriptions = {job_id: watch.join(job_id, 0.05) for job_id in jobs}
        firsts = [await asyncio.wait_for(s.next(), 1) for s in subscriptions.values()]
        assert [r.job.id for r in firsts if r.job] == jobs
        with world.store.sessions() as session, session.begin():  # only updated_at moves
            row = session.get(JobRow, changed)
            assert row is not None
            row.updated_at += 1
        reading = await asyncio.wait_for(subscriptions[changed].next(), 1)
        assert reading.job is not None and reading.job.id == changed and reading.alerts == ()
        with world.store.sessions() as session, session.begin():  # a new alert, the row as it was
            session.add(AlertRow(at=1.0, job_id=changed, job="job-0", share="research", kind="STARVING", reason="r"))
        reading = await asyncio.wait_for(subscriptions[changed].next(), 1)
        assert [alert.kind for alert in reading.alerts] == ["STARVING"]
        for job_id in unchanged:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(subscriptions[job_id].next(), 0.2)
        task = watch.task
        for subscription in subscriptions.values():
            subscription.leave()
        assert await _stopped(task)

    asyncio.run(scenario())


def test_a_new_trigger_gets_its_first_read_at_once_whatever_the_interval(world: QuotaWorld) -> None:
    waiting = world.submit("waiting", {"duration": 100_000})
    done = world.submit("done", {"duration": 10})
    world.step()
    world.step(1100.0)
    assert world.job(done.id).state == "SUCCEEDED"
    assert world.job(waiting.id).state == "RUNNING"  # its trigger keeps following it

    async def scenario() -> float:
        slow = _start(QuotaJobTrigger(job_id=waiting.id, poll_interval=30.0))
        await wait_for_async(
            lambda: [w.rounds > 0 for w in JobWatch.running()] == [True], what="the watch's first round"
        )
        # the next round is 30 s away
        started = time.monotonic()
        events = await events_of(QuotaJobTrigger(job_id=done.id, poll_interval=30.0).run())
        assert payload_of(events[0])["status"] == "success"
        elapsed = time.monotonic() - started
        await _cancel(slow)
        return elapsed

    assert asyncio.run(scenario()) < 1.0


def test_a_cancelled_trigger_leaves_its_watch_and_the_last_one_stops_it(world: QuotaWorld) -> None:
    first, second = (world.submit(name, {"duration": 100}).id for name in ("first", "second"))

    async def scenario() -> None:
        tasks = _start(*(QuotaJobTrigger(job_id=job_id, poll_interval=0.05) for job_id in (first, second)))
        await wait_for_async(lambda: [w.watching for w in JobWatch.running()] == [2], what="one watch of both triggers")
        (watch,) = JobWatch.running()
        task = watch.task
        assert task is not None
        await _cancel(tasks[:1])
        await wait_for_async(lambda: watch.watching == 1, what="the cancelled trigger to leave the watch")
        assert not task.done() and JobWatch.running() == [watch]
        await _cancel(tasks[1:])
        assert await _stopped(task)
        assert watch.watching == 0 and watch.task is None and JobWatch.running() == []

    asyncio.run(scenario())


def test_two_databases_get_two_watches(world: QuotaWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    other = make_engine(other_url)
    migrate(other)
    other_store = QuotaStore(other)
    other_store.apply_config(QUOTA)
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_OTHER", other_url)
    here = world.submit("here", {"duration": 100})
    there = other_store.submit(request("there"), "fake", {"duration": 100})
    assert here.id == there.id  # the same id in two databases: two different jobs

    async def scenario() -> None:
        tasks = _start(
            QuotaJobTrigger(job_id=here.id, quota_conn_id="quota_default", poll_interval=0.05),
            QuotaJobTrigger(job_id=there.id, quota_conn_id="quota_other", poll_interval=0.05),
        )
        await wait_for_async(
            lambda: sorted(w.watching for w in JobWatch.running()) == [1, 1], what="two watches of one trigger"
        )
        watches = JobWatch.running()
        assert sorted(w.url for w in watches) == sorted([world.url, other_url])
        assert [w.watching for w in watches] == [1, 1]
        subscriptions = [watch.join(here.id, 0.05) for watch in watches]
        readings = [await asyncio.wait_for(s.next(), 1) for s in subscriptions]
        assert {r.job.name for r in readings if r.job} == {"here", "there"}
        await _cancel(tasks)
        assert [w.watching for w in watches] == [1, 1]  # the subscriptions of this test are still there
        for subscription in subscriptions:
            subscription.leave()
        assert JobWatch.running() == []

    asyncio.run(scenario())
    other.dispose()


def test_each_event_loop_has_its_own_watch(world: QuotaWorld) -> None:
    job = world.submit("shared", {"duration": 100})
    seen: list[tuple[JobWatch, bool]] = []
    barrier = threading.Barrier(2)

    async def follow() -> None:
        watch = JobWatch.for_url(world.url)
        subscription = watch.join(job.id, 0.05)
        # a bound, not a pace: the first read opens the database, slow on a loaded machine
        await asyncio.wait_for(subscription.next(), 30)
        await asyncio.to_thread(barrier.wait, 30)  # both loops follow the job at the same time
        seen.append((watch, watch.loop is asyncio.get_running_loop()))
        subscription.leave()

    threads = [threading.Thread(target=asyncio.run, args=(follow(),)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(70)
    assert len(seen) == 2 and seen[0][0] is not seen[1][0] and all(own for _, own in seen)


def test_read_failures_give_every_trigger_the_error_event_after_read_attempts(
    world: QuotaWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = [world.submit(f"job-{i}", {"duration": 100}).id for i in range(3)]
    store = store_for(world.url)
    read = store.jobs_by_ids
    calls: list[int] = []

    def flaky(ids: Collection[int]) -> list[JobRow]:
        calls.append(len(ids))
        if len(calls) == 1 or len(calls) == 5:  # the first read, then one in the middle of failures
            return read(ids)
        raise DatabaseUnavailable(f"quota database {world.url} is unreachable: call {len(calls)}")

    monkeypatch.setattr(store, "jobs_by_ids", flaky)

    async def scenario() -> list[list[TriggerEvent]]:
        tasks = _start(*(QuotaJobTrigger(job_id=job_id, poll_interval=0.02) for job_id in jobs))
        return await asyncio.gather(*tasks)

    events = asyncio.run(scenario())
    read_attempts = QuotaJobTrigger.read_attempts
    # the reads are shared: one series for all triggers (a trigger that joins after the first
    # round may cost one read of its own), where polling alone they would make len(jobs) series
    assert 5 + read_attempts <= len(calls) <= 5 + read_attempts + len(jobs) - 1, calls
    unreachable = re.compile(
        rf"quota job (\d+): the quota database stayed unreadable: quota database {re.escape(world.url)} "
        r"is unreachable: call (\d+)"
    )
    for job_id, fired in zip(jobs, events, strict=True):
        assert len(fired) == 1, fired
        payload = payload_of(fired[0])
        assert (payload["status"], payload["job_id"], payload["state"], payload["reason"]) == (
            "error",
            job_id,
            None,
            None,
        )
        matched = unreachable.fullmatch(payload["message"])
        assert matched and int(matched.group(1)) == job_id, payload
        assert int(matched.group(2)) > 5  # only the failures after the success count
    warnings = [line for line in capsys.readouterr().out.splitlines() if "cannot read the quota database" in line]
    assert sum(f"({read_attempts} of {read_attempts})" in line for line in warnings) == len(jobs)
    assert sum("(3 of 5)" in line for line in warnings) > len(jobs)  # counted again after the success
