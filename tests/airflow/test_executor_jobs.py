"""The quota side of QuotaExecutor against the real quota scheduler (``QuotaService`` on a manual
clock) with the ``airflow`` backend: one job per task instance whatever the re-queues, placement
and reports through ``quota_task_reports``, a preemption's stop request, and the try after a
preemption that ended the job failing with the job's reason instead of submitting again."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from airflow_quota.core.access import Actor
from airflow_quota.executors.jobs import ExecutorJobs, TaskIdentity, TaskRefused
from airflow_quota.service.backends.executor import ExecutorBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import JobRow
from airflow_quota.store.repository import QuotaStore
from tests.airflow.conftest import QUOTA
from tests.builders import write_forecast

G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]
DAG = Actor.of_dag("dag", tags=["team-research"])
"""The DAG the tasks below belong to, as the executor reads it from Airflow's database."""


class World:
    def __init__(self, service: QuotaService, clock: ManualClock, store: QuotaStore) -> None:
        self.service, self.clock, self.store = service, clock, store
        self.jobs = ExecutorJobs()

    def step(self, seconds: float = 1.0) -> None:
        self.clock.advance_to(self.clock.now() + seconds)
        self.service.step()

    def job(self, job_id: int) -> JobRow:
        row = self.store.job(job_id)
        assert row is not None
        return row


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    engine = make_engine(url)
    migrate(engine)
    clock = ManualClock(1_000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    backend = ExecutorBackend(engine, poll_interval_seconds=0.0)
    service = QuotaService(engine, {"airflow": backend}, clock=clock, refresh_views_seconds=0.0)
    service.step()
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_DEFAULT", url)
    yield World(service, clock, store)
    engine.dispose()


def task(name: str, try_number: int = 1) -> TaskIdentity:
    return TaskIdentity("dag", name, "run1", -1, try_number)


def arguments(share: str = "research", **more: Any) -> dict[str, Any]:
    return {"share": share, "instance_preferences": G5, **more}


def test_a_task_instance_is_one_job_whatever_the_requeues(world: World) -> None:
    first = world.jobs.job_for(task("a"), arguments(), None, DAG)
    again = world.jobs.job_for(task("a"), arguments(), None, DAG)  # a re-queue, an adoption
    assert again.id == first.id and first.backend == "airflow"
    assert world.jobs.job_for(task("b"), arguments(), None, DAG).id != first.id


def test_the_configs_expected_runtime_is_stored_with_the_job_for_the_forecast(world: World) -> None:
    timed = world.jobs.job_for(task("a"), arguments(expected_runtime=timedelta(minutes=90)), None, DAG)
    seconds = world.jobs.job_for(task("b"), arguments(expected_runtime=600), None, DAG)
    untimed = world.jobs.job_for(task("c"), arguments(), None, DAG)
    stored = [world.job(job.id).expected_runtime_seconds for job in (timed, seconds, untimed)]
    assert stored == [5400.0, 600.0, None]


def test_a_placed_job_waits_for_the_executor_then_follows_its_reports(world: World) -> None:
    job = world.jobs.job_for(task("a"), arguments(), None, DAG)
    world.step()
    world.step()
    assert world.job(job.id).state == "SCHEDULED"  # placed; the backend waits for the executor
    latest = world.jobs.attempts({job.id})[job.id]
    assert (latest.number, latest.status, latest.instance_type) == (1, "PENDING", "ml.g5.xlarge")
    world.jobs.report(job.id, 1, "RUNNING", None, 1)
    world.step()
    assert world.job(job.id).state == "RUNNING"
    world.jobs.report(job.id, 1, "SUCCEEDED", None, 1)
    world.step()
    assert world.job(job.id).state == "SUCCEEDED"
    # the task cleared and run again: a new job
    assert world.jobs.job_for(task("a", 2), arguments(), None, DAG).id != job.id


def test_the_narrow_read_of_held_jobs_agrees_with_the_whole_rows_step_by_step(world: World) -> None:
    """QuotaExecutor reads every held job's state and attempt count at each sync, and whole rows
    and attempts only for the jobs that moved (issue 17's benchmark): a job with an attempt row
    must never show 0 attempts in the narrow read."""
    ids = [world.jobs.job_for(task(name), arguments(), None, DAG).id for name in ("a", "b", "c")]
    seen: set[tuple[str, int]] = set()
    for _ in range(3):
        states = world.jobs.states([*ids, 999_999])
        rows = world.jobs.jobs(ids)
        attempts = world.jobs.attempts(ids)
        waits = {
            i: (r.pending_reason, r.waiting_for, r.position_in_share, r.position_in_queue) for i, r in rows.items()
        }
        assert states == {i: (rows[i].state, rows[i].attempts, rows[i].pending_deadline, *waits[i]) for i in ids}
        assert {i for i in ids if states[i][1] > 0} == set(attempts)
        assert all(attempts[i].number == states[i][1] for i in attempts)
        seen |= {(progress.state, progress.attempts) for progress in states.values()}
        world.step()
    assert ("RUNNABLE", 0) in seen and ("SCHEDULED", 1) in seen, seen


def test_a_reclaim_asks_the_executor_to_stop_and_the_next_try_finds_the_same_job(world: World) -> None:
    own = world.jobs.job_for(task("own"), arguments(), None, DAG)
    borrower = world.jobs.job_for(task("borrower"), arguments(), None, DAG)
    world.step()
    world.step()
    for job in (own, borrower):
        world.jobs.report(job.id, 1, "RUNNING", None, 1)
    world.step()
    assert world.job(borrower.id).borrowed == 1
    world.jobs.job_for(task("prod"), arguments("prod"), None, DAG)
    world.step()
    world.step()
    victim = next(j for j in (own, borrower) if world.job(j.id).preemptions == 1)
    report = world.jobs.reports({(victim.id, 1)})[victim.id, 1]
    assert report.stop_requested_at is not None and report.stop_grace == 0.0
    world.jobs.report(victim.id, 1, "STOPPED", "Preempted", 1)
    world.step()
    world.step()
    assert world.job(victim.id).state == "RUNNABLE"
    requeued = world.jobs.job_for(task(victim.task_id or "", 2), arguments(), None, DAG)
    assert requeued.id == victim.id  # keeps its first submission time


def test_the_try_after_a_preemption_that_ended_the_job_fails_with_its_reason(world: World) -> None:
    own = world.jobs.job_for(task("own"), arguments(preemption_retries=0), None, DAG)
    borrower = world.jobs.job_for(task("borrower"), arguments(preemption_retries=0), None, DAG)
    world.step()
    world.step()
    for job in (own, borrower):
        world.jobs.report(job.id, 1, "RUNNING", None, 1)
    world.step()
    world.jobs.job_for(task("prod"), arguments("prod"), None, DAG)
    world.step()
    world.step()
    victim = next(j for j in (own, borrower) if world.job(j.id).preemptions == 1)
    world.jobs.report(victim.id, 1, "STOPPED", "Preempted", 1)
    world.step()
    world.step()
    assert (world.job(victim.id).state, world.job(victim.id).reason) == ("FAILED", "PREEMPTION_LIMIT")
    with pytest.raises(TaskRefused, match="PREEMPTION_LIMIT"):
        world.jobs.job_for(task(victim.task_id or "", 2), arguments(preemption_retries=0), None, DAG)
    # an Airflow retry after that failure is a new job
    assert world.jobs.job_for(task(victim.task_id or "", 3), arguments(), None, DAG).id != victim.id


def test_a_refused_submission_names_the_rule(world: World) -> None:
    with pytest.raises(TaskRefused, match="share: no share named 'nowhere'"):
        world.jobs.job_for(task("a"), arguments("nowhere"), None, DAG)
    with pytest.raises(TaskRefused, match="priority: 60 is above share 'research'"):
        world.jobs.job_for(task("b"), arguments(), 60, DAG)  # a run's quota_priority above max_priority


def test_a_share_s_access_rule_decides_which_dags_tasks_it_takes(world: World) -> None:
    research, prod = QUOTA["shares"]
    ruled = {**research, "access": {"submit": {"tags": ["team-research"]}}}
    world.store.apply_config({**QUOTA, "shares": [ruled, prod]})
    world.step()
    assert world.jobs.job_for(task("ours"), arguments(), None, DAG).share == "research"
    with pytest.raises(TaskRefused, match=r"access\.submit: share 'research' takes submissions only from"):
        world.jobs.job_for(task("theirs"), arguments(), None, Actor.of_dag("other", tags=["team-prod"]))
    assert [j.task_id for j in world.store.jobs()] == ["ours"]


def test_a_held_task_says_once_when_its_max_pending_time_falls_due(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 16: a task QuotaExecutor holds has no log of its own yet, so the executor says in
    its log and in the task instance's audit log (Airflow's ``log`` table) when the wait ends,
    once per wait, from the deadline its narrow read of held jobs carries."""
    from airflow.models.taskinstancekey import TaskInstanceKey

    from airflow_quota.executors.quota_executor import Held, QuotaExecutor

    for name in ("a", "b"):  # research's g5 and the one it borrows from prod
        world.jobs.job_for(task(name), arguments(), None, DAG)
    waits = arguments(max_pending_time=600)
    job = world.jobs.job_for(task("c"), waits, None, DAG)
    executor = QuotaExecutor(parallelism=1)
    key = TaskInstanceKey("dag", "c", "run1", 1, -1)
    # the workload is only read once the job is placed, which it is not here
    executor.held[key] = Held(cast(Any, None), waits, None, since=1000.0, job_id=job.id)
    for _ in range(3):
        world.step()
        executor._follow(world.clock.now())
    assert world.job(job.id).state == "RUNNABLE" and world.job(job.id).pending_deadline == 1601.0
    line = (
        f"quota job {job.id}: max_pending_time 10 minutes: it fails with PENDING_TIMEOUT at 00:26 UTC (in 10 minutes)"
        " if it is still waiting then"
    )
    assert [(entry.event, entry.extra) for entry in executor._task_event_logs] == [("quota executor", line)]
    said = [out for out in capsys.readouterr().out.splitlines() if "max_pending_time" in out]
    assert len(said) == 1 and f"{key} held: {line}" in said[0], said


def held_workload(name: str) -> Any:
    """A queued try as Airflow hands it to the executor, its log where Airflow would write it."""
    from airflow.executors.workloads import BundleInfo, ExecuteTask
    from airflow.executors.workloads.task import TaskInstanceDTO

    ti = TaskInstanceDTO(
        id=uuid.uuid4(),
        task_id=name,
        dag_id="dag",
        run_id="run1",
        try_number=1,
        dag_version_id=uuid.uuid4(),
        map_index=-1,
        pool_slots=1,
        priority_weight=1,
        queue="research",
    )
    log_path = f"dag_id=dag/run_id=run1/task_id={name}/attempt=1.log"
    return ExecuteTask(
        ti=ti, token="", dag_rel_path="dag.py", bundle_info=BundleInfo(name="dags-folder"), log_path=log_path
    )


def test_a_held_task_keeps_why_it_waits_and_its_timeout_is_one_line_in_its_log(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38: while QuotaExecutor holds a task, it keeps why the job waits (each change once:
    the try's log tells it when it starts); a job that fails while held (here PENDING_TIMEOUT)
    fails the task with one readable line in the try's own log, the only line it will have."""
    from airflow.models.taskinstancekey import TaskInstanceKey

    from airflow_quota.executors.quota_executor import Held, QuotaExecutor

    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", str(tmp_path / "logs"))
    for name in ("a", "b"):  # research's g5 and the one it borrows from prod
        world.jobs.job_for(task(name), arguments(), None, DAG)
    waits = arguments(max_pending_time=60)
    job = world.jobs.job_for(task("c"), waits, None, DAG)
    executor = QuotaExecutor(parallelism=1)
    key = TaskInstanceKey("dag", "c", "run1", 1, -1)
    workload = held_workload("c")
    executor.held[key] = Held(workload, waits, None, since=1000.0, job_id=job.id, job_name=job.name, share="research")
    for _ in range(3):
        world.step()
        executor._follow(world.clock.now())
    row = world.job(job.id)
    assert row.state == "RUNNABLE" and row.position_in_share == 1
    noted = [line for _, line in executor.held[key].waits.lines]
    assert noted == [
        f"quota job {job.id} ({job.name}) in share research is RUNNABLE: {row.pending_reason}"
        f" for {row.waiting_for}, position 1 in its share (1 in the whole queue)"
    ], noted
    world.step(61.0)
    executor._follow(world.clock.now())
    row = world.job(job.id)
    assert (row.state, row.reason) == ("FAILED", "PENDING_TIMEOUT")
    assert key not in executor.held and executor.event_buffer[key][0] == "failed"
    records = [json.loads(line) for line in (tmp_path / "logs" / workload.log_path).read_text().splitlines()]
    assert [(r["level"], r["event"]) for r in records] == [
        (
            "error",
            f"the quota did not run this try: quota job {job.id} ({job.name}) in share research FAILED: "
            f"PENDING_TIMEOUT: {row.detail}",
        )
    ]


def test_a_preempted_job_s_second_try_tells_its_story_in_time_order(world: World) -> None:
    """Issue 38: what the try after a preemption logs when it starts (``executors/story.py``):
    submitted, placed (borrowing), preempted (by whom), waited (why), placed again, what it runs
    on now and where it resumes from, in the operator's words, in time order."""
    from airflow_quota.executors.placement import Placement
    from airflow_quota.executors.story import story_so_far
    from airflow_quota.hooks.quota import QuotaHook

    own = world.jobs.job_for(task("own"), arguments(priority=5), None, DAG)
    borrower = world.jobs.job_for(task("borrower"), arguments(priority=1), None, DAG)
    world.step()
    world.step()
    for job in (own, borrower):
        world.jobs.report(job.id, 1, "RUNNING", None, 1)
    world.step()
    prod = world.jobs.job_for(task("prod"), arguments("prod"), None, DAG)
    world.step()
    world.step()
    assert world.job(borrower.id).preemptions == 1  # the lower priority of the two
    world.jobs.report(borrower.id, 1, "STOPPED", "Preempted", 1)
    world.step()
    world.step()
    waiting = world.job(borrower.id)
    assert waiting.state == "RUNNABLE"
    waited = [(world.clock.now(), f"quota job {borrower.id} is RUNNABLE: a line the executor kept")]
    world.step()
    world.jobs.report(prod.id, 1, "RUNNING", None, 1)
    world.jobs.report(prod.id, 1, "SUCCEEDED", None, 1)
    for _ in range(3):
        world.step()
    placed = world.job(borrower.id)
    assert (placed.state, placed.attempts) == ("SCHEDULED", 2), placed.state
    placement = Placement("research", borrower.id, 2, "ml.g5.xlarge", 1, None, "s3://bucket/ckpt", 1)
    lines = story_so_far(QuotaHook(), placement, waited, try_number=2)
    expected = [
        f"submitted as quota job {borrower.id} to share research ({borrower.name}, priority 1)",
        f"PLACED {borrower.name} [research] on 1x ml.g5.xlarge, attempt 1",
        f"PREEMPTED {borrower.name} [research] CROSS_SHARE by {prod.name}",
        "is RUNNABLE: a line the executor kept",
        f"PLACED {borrower.name} [research] on 1x ml.g5.xlarge, attempt 2",
        f"this try (Airflow try 2): quota job {borrower.id} ({borrower.name}) in share research is SCHEDULED on 1x",
        f"quota job {borrower.id} resumes on attempt 2 after 1 preemption(s), from checkpoint s3://bucket/ckpt",
    ]
    found = [next((i for i, line in enumerate(lines) if phrase in line), None) for phrase in expected]
    assert None not in found and found == sorted(found), "\n".join(lines)
    assert lines[found[1]].endswith("borrowing 1"), lines[found[1]]  # the placement's own words


def test_a_held_task_keeps_its_forecast_and_a_line_again_only_when_it_moves(world: World) -> None:
    """Issue 41: a held task's wait lines (its try's log when it starts) hold its job's forecast
    when it first comes and again when it moves by more than 10% of the wait it had left. The
    rows are written by hand here, so the moves are known."""
    from airflow.models.taskinstancekey import TaskInstanceKey

    from airflow_quota.executors.quota_executor import Held, QuotaExecutor

    for name in ("a", "b"):  # research's g5 and the one it borrows from prod
        world.jobs.job_for(task(name), arguments(), None, DAG)
    job = world.jobs.job_for(task("c"), arguments(), None, DAG)
    executor = QuotaExecutor(parallelism=1)
    key = TaskInstanceKey("dag", "c", "run1", 1, -1)
    executor.held[key] = Held(
        held_workload("c"), arguments(), None, since=1000.0, job_id=job.id, job_name=job.name, share="research"
    )
    world.step()
    assert world.job(job.id).state == "RUNNABLE"

    def forecast_in(seconds: float) -> None:
        now = world.clock.now()
        write_forecast(world.service.engine, job.id, now, now + seconds, 60, "share history")
        executor._follow(world.clock.now())

    def forecast_lines() -> list[str]:
        return [line for _, line in executor.held[key].waits.lines if "expected to start around" in line]

    forecast_in(3600)
    forecast_in(3600 + 60)  # a minute of an hour: no new line
    assert len(forecast_lines()) == 1 and forecast_lines()[0].startswith(f"quota job {job.id}: expected to start")
    forecast_in(2 * 3600)
    assert len(forecast_lines()) == 2, forecast_lines()
