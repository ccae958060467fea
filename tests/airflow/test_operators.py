"""QuotaTrainingOperator against a real SQLite quota database and the real quota scheduler:
deferral, idempotent submission, every final state, parse-time validation, priority overrides,
and the docstring's "(templated)" markers."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.exceptions import AirflowConfigException, AirflowProviderDeprecationWarning
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from sqlalchemy import update

from airflow_quota.core.catalogue import builtin_catalogue
from airflow_quota.exceptions import InvalidInput
from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.operators import training as training_module
from airflow_quota.operators.deferral import ENVIRONMENT_VARIABLE
from airflow_quota.operators.training import QuotaTrainingOperator, client_token, derived_job_name
from airflow_quota.sensors.quota import QuotaCapacitySensor, QuotaJobSensor
from airflow_quota.store.models import Attempt, JobRow
from airflow_quota.triggers.quota import DEFER_SETTLE_SECONDS, QuotaJobTrigger
from tests.airflow.conftest import G5, QuotaWorld, events_of, payload_of, request
from tests.airflow.task_context import RUN_ID, TaskInstance, context, deferred
from tests.waiting import wait_for


def operator(**overrides: Any) -> QuotaTrainingOperator:
    arguments: dict[str, Any] = {
        "task_id": "train",
        "share": "research",
        "priority": 5,
        "instance_preferences": G5,
        "command": "python train.py",
        "check_interval": 0.01,
    }
    return QuotaTrainingOperator(**{**arguments, **overrides})


# -- execute ---------------------------------------------------------------------------------


def test_execute_submits_then_defers_to_a_trigger_that_owns_the_job(world: QuotaWorld) -> None:
    ti = TaskInstance()
    before = time.time()
    trigger = deferred(operator(env={"EPOCHS": "3"}, cwd="/srv/train"), context(ti))
    after = time.time()
    job = world.job(trigger.job_id)
    kwargs = trigger.serialize()[1]
    # held past Airflow's race between the deferring try's end and its resumption
    assert before + DEFER_SETTLE_SECONDS <= kwargs.pop("fire_not_before") <= after + DEFER_SETTLE_SECONDS
    assert kwargs == {
        "job_id": job.id,
        "quota_conn_id": "quota_default",
        "poll_interval": 0.01,
        "cancel_on_kill": True,
        "print_log": True,
        "aws_conn_id": None,
        "give_up_at": None,
    }
    assert (job.share, job.priority, job.backend, job.state) == ("research", 5, "local", "SUBMITTED")
    assert job.name == derived_job_name("train_daily", "train", RUN_ID, -1)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,128}", job.name)
    assert job.training == {"command": "python train.py", "env": {"EPOCHS": "3"}, "cwd": "/srv/train"}
    assert (job.client_token, job.dag_id, job.run_id) == (
        client_token("train_daily", "train", RUN_ID, -1),
        "train_daily",
        RUN_ID,
    )
    assert ti.xcoms == {"quota_job_id": job.id}


@pytest.mark.parametrize(
    ("expected_runtime", "stored"),
    [(timedelta(minutes=90), 5400.0), (600, 600.0), (None, None)],
    ids=["a timedelta", "seconds", "not given"],
)
def test_the_expected_runtime_is_stored_with_the_job_for_the_forecast(
    world: QuotaWorld, expected_runtime: timedelta | float | None, stored: float | None
) -> None:
    job = world.job(deferred(operator(expected_runtime=expected_runtime), context()).job_id)
    assert job.expected_runtime_seconds == stored
    assert "expected_runtime" not in str(job.request), "beside the request: no scheduling decision reads it"


def test_execute_twice_and_a_retry_after_a_worker_crash_submit_once(world: QuotaWorld) -> None:
    first = deferred(operator(), context(TaskInstance()))
    again = deferred(operator(), context(TaskInstance()))
    retried = deferred(operator(), context(TaskInstance(try_number=2)))
    assert first.job_id == again.job_id == retried.job_id
    assert len(world.store.jobs()) == 1


def test_mapped_instances_get_their_own_jobs(world: QuotaWorld) -> None:
    ids = {deferred(operator(), context(TaskInstance(map_index=i))).job_id for i in range(3)}
    assert len(ids) == 3


def test_execute_returns_at_once_for_a_job_already_succeeded(world: QuotaWorld) -> None:
    job_id = deferred(operator(), context()).job_id
    world.step(1000.0)
    world.step(1001.0)
    assert world.job(job_id).state == "SUCCEEDED"
    summary = operator().execute(context(TaskInstance(try_number=2)))  # the retry finds it done
    assert summary is not None and summary["job_id"] == job_id and summary["state"] == "SUCCEEDED"
    assert len(world.store.jobs()) == 1


def test_a_retry_after_a_failed_or_cancelled_job_submits_a_new_one(world: QuotaWorld) -> None:
    first = deferred(operator(), context()).job_id
    world.store.cancel(first)  # the user cleared the task: its trigger cancelled the job...
    second = deferred(operator(), context(TaskInstance(try_number=2))).job_id  # ...before it was taken in
    world.step()
    assert (world.job(first).state, world.job(first).reason) == ("FAILED", "CANCELLED")
    assert second != first and world.job(second).name.endswith("-r2")
    assert world.job(second).client_token == client_token("train_daily", "train", RUN_ID, -1, generation=2)
    assert deferred(operator(), context(TaskInstance(try_number=3))).job_id == second


def test_not_deferrable_waits_in_the_worker(world: QuotaWorld) -> None:
    def drive() -> None:
        wait_for(world.store.jobs, 30, "the operator to submit its job", interval=0.01)
        world.step(1000.0)
        world.step(1001.0)

    driver = threading.Thread(target=drive)
    driver.start()
    summary = operator(deferrable=False).execute(context())
    driver.join()
    assert summary is not None and summary["state"] == "SUCCEEDED"


def test_waiting_in_the_worker_logs_once_when_max_pending_time_falls_due(
    world: QuotaWorld, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16, not deferrable: the task log says when the wait ends, once, though the worker
    reads the waiting job many times. The operator reads the wall clock; here the world's."""
    monkeypatch.setattr(training_module, "time", SimpleNamespace(time=world.clock.now, sleep=time.sleep))
    world.submit("hog1", {"duration": 1000})
    world.submit("hog2", {"duration": 1000}, share="prod")
    world.step()
    op = operator(deferrable=False, max_pending_time=timedelta(hours=2))
    waiting_reads = threading.Semaphore(0)
    get_job = op.hook.get_job

    def counted(job_id: int) -> JobRow | None:
        row = get_job(job_id)
        if row is not None and row.state == "RUNNABLE":
            waiting_reads.release()
        return row

    monkeypatch.setattr(op.hook, "get_job", counted)

    def drive() -> None:
        wait_for(lambda: len(world.store.jobs()) >= 3, 30, "the operator to submit its job", interval=0.01)
        world.step(1001.0)  # taken in: waits, at most until 8201
        for _ in range(5):  # the worker reads the waiting job again and again
            assert waiting_reads.acquire(timeout=30)
        world.step(2001.0)  # the hogs end: placed
        world.step(2101.0)

    driver = threading.Thread(target=drive)
    driver.start()
    summary = op.execute(context())
    driver.join()
    assert summary is not None and summary["state"] == "SUCCEEDED"
    job_id = summary["job_id"]
    due = [line for line in capsys.readouterr().out.splitlines() if "max_pending_time" in line]
    assert len(due) == 1, due
    assert (
        f"quota job {job_id}: max_pending_time 2 hours: it fails with PENDING_TIMEOUT at 02:16 UTC (in 2 hours)"
        " if it is still waiting then" in due[0]
    )


def test_on_kill_cancels_the_job(world: QuotaWorld) -> None:
    op = operator()
    job_id = deferred(op, context()).job_id
    op.on_kill()
    world.step()
    assert (world.job(job_id).state, world.job(job_id).reason) == ("FAILED", "CANCELLED")


# -- execute_complete ------------------------------------------------------------------------


def succeeded(world: QuotaWorld) -> JobRow:
    job = world.submit("ok", {"duration": 3600})
    world.step(1000.0)
    world.step(4600.0)
    return job


def attempts_exhausted(world: QuotaWorld) -> JobRow:
    job = world.submit("crash", {"duration": 100, "failures": [{"after": 5, "reason": "ExitCode:3"}]})
    world.step(1000.0)
    world.step(1100.0)
    return job


def pending_timeout(world: QuotaWorld) -> JobRow:
    world.submit("hog1", {"duration": 1000})
    world.submit("hog2", {"duration": 1000}, share="prod")
    job = world.submit("late", {"duration": 10}, max_pending_seconds=50)
    world.step(1000.0)
    world.step(1100.0)
    return job


def capacity_error(world: QuotaWorld) -> JobRow:
    job = world.submit("cpu", {"capacity_error": True}, preferences=[{"instance_type": "ml.c5.xlarge", "count": 1}])
    world.step(1000.0)
    world.step(1001.0)
    return job


def preemption_limit(world: QuotaWorld) -> JobRow:
    world.submit("mine", {"duration": 1000})
    job = world.submit("borrower", {"duration": 1000}, preemption_retries=0)
    world.step(1000.0)
    world.submit("owner", {"duration": 10}, share="prod")
    world.step(1010.0)
    return job


def cancelled(world: QuotaWorld) -> JobRow:
    job = world.submit("unwanted", {"duration": 100})
    world.store.cancel(job.id)
    world.step(1000.0)
    return job


def event_for(job: JobRow) -> dict[str, Any]:
    status = "success" if job.state == "SUCCEEDED" else "failed"
    return {"status": status, "job_id": job.id, "state": job.state, "reason": job.reason, "message": "final"}


def test_execute_complete_on_success_returns_the_summary(world: QuotaWorld, capsys: pytest.CaptureFixture[str]) -> None:
    job = world.job(succeeded(world).id)
    summary = operator().execute_complete(context(), event_for(job))
    price = builtin_catalogue()["ml.g5.xlarge"].hourly_price
    assert summary == {
        "job_id": job.id,
        "job_name": "ok",
        "share": "research",
        "state": "SUCCEEDED",
        "instance_type": "ml.g5.xlarge",
        "instance_count": 1,
        "training_plan": None,
        "borrowed": 0,
        "attempts": 1,
        "preemptions": 0,
        "lost_gpu_hours": 0.0,
        "gpu_hours": 1.0,
        "cost": round(price, 6),
        "wait_seconds": 0.0,
    }
    out = capsys.readouterr().out
    assert "t=1000 PLACED ok [research] on 1x ml.g5.xlarge, attempt 1: within its share's limit" in out
    assert "t=4600 SUCCEEDED ok [research]" in out


@pytest.mark.parametrize(
    ("scenario", "reason", "detail", "error"),
    [
        (attempts_exhausted, "ATTEMPTS_EXHAUSTED", "ExitCode:3: attempt 1 of 1 failed", AirflowException),
        (pending_timeout, "PENDING_TIMEOUT", "RUNNABLE for 50 s (max_pending_seconds)", AirflowException),
        (capacity_error, "CAPACITY_ERROR", "no provider capacity for a CPU-only list", AirflowException),
        (preemption_limit, "PREEMPTION_LIMIT", "preempted 1 times", AirflowException),
        (cancelled, "CANCELLED", "cancelled", AirflowFailException),
    ],
    ids=[
        "a training that keeps failing",
        "waited longer than max_pending_time",
        "a CPU-only list the provider cannot serve",
        "preempted more than preemption_retries",
        "cancelled by someone: no Airflow retry",
    ],
)
def test_execute_complete_fails_with_the_quota_reason(
    world: QuotaWorld,
    scenario: Callable[[QuotaWorld], JobRow],
    reason: str,
    detail: str,
    error: type[Exception],
) -> None:
    job = world.job(scenario(world).id)
    assert (job.state, job.reason) == ("FAILED", reason)
    with pytest.raises(error) as failure:
        operator().execute_complete(context(), event_for(job))
    assert str(failure.value) == f"quota job {job.id} ({job.name}) failed: {reason}: {detail}"
    if error is AirflowException:
        assert not isinstance(failure.value, AirflowFailException)  # Airflow may retry: a new job


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (None, "unexpected event from the quota trigger: a quota job event is a mapping, got None"),
        ({"status": "done", "job_id": 1}, "status is one of success, failed, error, timeout, got 'done'"),
        ({"status": "success", "job_id": "1"}, "job_id is an integer, got '1'"),
        (
            {
                "status": "error",
                "job_id": 4,
                "state": None,
                "reason": None,
                "message": "the database stayed unreadable",
            },
            "quota job 4: the database stayed unreadable",
        ),
    ],
    ids=["no event", "unknown status", "job id not an integer", "the trigger could not follow the job"],
)
def test_execute_complete_refuses_a_bad_or_error_event(world: QuotaWorld, event: Any, message: str) -> None:
    with pytest.raises(AirflowException, match=re.escape(message)):
        operator().execute_complete(context(), event)


# -- parse-time validation -------------------------------------------------------------------


def six() -> list[dict[str, Any]]:
    return [
        {"instance_type": f"ml.g5.{size}", "count": 1}
        for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge")
    ]


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (
            {"instance_preferences": six()},
            "instance_preferences: 6 instance types listed; a job lists at most 5",
        ),
        (
            {"instance_preferences": [*G5, {"instance_type": "ml.g5.xlarge", "count": 2}]},
            "instance_preferences: instance type ml.g5.xlarge is listed twice; each type at most once",
        ),
        (
            {"instance_preferences": [{"instance_type": "ml.g5.xlarge", "count": 0}]},
            "instance_preferences[0].count: Input should be greater than or equal to 1",
        ),
        (
            {"instance_preferences": []},
            "instance_preferences: List should have at least 1 item after validation, not 0",
        ),
        (
            {"instance_preferences": [{"instance_type": "ml.g5.xlarge", "count": 1, "gpus": 4}]},
            "instance_preferences[0].gpus: unknown key; the known ones are instance_type, count, training_plan",
        ),
        (
            {"instance_preferences": [{"instance_type": "ml.g5.xlarge", "cuont": 1}]},
            "instance_preferences[0].cuont: unknown key; did you mean 'count'?"
            " The known ones are instance_type, count, training_plan",
        ),
        ({"backend": "kubernetes"}, "backend: 'kubernetes' is not one of local, sagemaker"),
        ({"command": None}, "command: the local backend needs a non-empty string or list of strings, got None"),
        ({"command": "  "}, "command: the local backend needs a non-empty string or list of strings, got '  '"),
        ({"priority": 10000}, "priority: Input should be less than or equal to 9999"),
        ({"max_pending_time": -5}, "max_pending_time: Input should be greater than 0"),
        (
            {"expected_runtime": timedelta(0)},
            "expected_runtime: must be more than 0 seconds and at most ten years"
            " (how long the training is expected to run), got 0 seconds",
        ),
        ({"expected_runtime": "an hour"}, "expected_runtime: must be seconds or a timedelta, got 'an hour'"),
        ({"retry_attempts": 11}, "retry_attempts: Input should be less than or equal to 10"),
        ({"job_name": "nightly run!"}, "job_name: String should match pattern '^[A-Za-z0-9_-]{1,128}$'"),
        ({"check_interval": 0}, "check_interval: must be a positive number of seconds, got 0"),
        ({"max_attempts": 0}, "max_attempts: must be a whole number of looks (1 or more) or None, got 0"),
        (
            {"poll_interval": 2.0},
            "poll_interval: is the old name of check_interval; give only check_interval",
        ),
        (
            {
                "backend": "sagemaker",
                "command": None,
                "training_request": {"ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "VolumeSizeInGB": 50}},
            },
            "training_request.ResourceConfig.InstanceType:"
            " is chosen by the quota scheduler from instance_preferences; leave it out",
        ),
        (
            {
                "backend": "sagemaker",
                "command": None,
                "training_request": {"AlgorithmSpecification": {}},
                "checkpoint_uri": "/tmp/ckpt",
            },
            "checkpoint_uri: SageMaker saves checkpoints only to S3, got '/tmp/ckpt'",
        ),
        (
            {"backend": "sagemaker", "training_request": {"RoleArn": "arn"}},
            "command: is for the local backend; the sagemaker backend runs training_request",
        ),
        (
            {"backend": "sagemaker", "command": None},
            "training_request: the sagemaker backend needs a CreateTrainingJob request, got None",
        ),
        (
            {"training_request": {"RoleArn": "arn"}},
            "training_request: is for the sagemaker backend; the local backend runs command",
        ),
    ],
    ids=[
        "six preferences",
        "a type listed twice",
        "count 0",
        "an empty preference list",
        "an unknown key in an entry",
        "a misspelled key in an entry",
        "an unknown backend",
        "the local backend without a command",
        "a blank command",
        "priority above 9999",
        "a negative max_pending_time",
        "an expected runtime of nothing",
        "an expected runtime in words",
        "eleven retry attempts",
        "a job name with a space",
        "a zero check interval",
        "no look at all",
        "the old and the new name of the interval, disagreeing",
        "a SageMaker request choosing its own instance type",
        "a SageMaker checkpoint outside S3",
        "a command for SageMaker",
        "SageMaker without a training request",
        "a training request for the local backend",
    ],
)
def test_a_bad_argument_fails_dag_import_naming_the_field(arguments: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidInput) as failure:
        operator(**arguments)
    assert problem in [str(p) for p in failure.value.problems]


def test_templated_fields_are_checked_once_rendered() -> None:
    op = operator(
        instance_preferences="{{ params.preferences }}", job_name="{{ params.name }}", share="{{ params.share }}"
    )
    assert op.instance_preferences == "{{ params.preferences }}"


def test_arguments_still_wrong_once_rendered_fail_the_task_without_retry(world: QuotaWorld) -> None:
    op = operator(job_name="{{ params.name }}")
    op.job_name = "not valid!"  # what rendering produced
    with pytest.raises(AirflowFailException, match=r"job_name: String should match pattern"):
        op.execute(context())
    assert world.store.jobs() == []


# -- priority overrides ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conf", "params", "priority"),
    [
        ({}, {}, 5),
        ({"quota_priority": 40}, {}, 40),
        ({"quota_priority": 40}, {"quota_priority": 30}, 30),
        ({}, {"quota_priority": None}, 5),
    ],
    ids=[
        "no override: the task's own priority",
        "the run's conf overrides it",
        "a declared Param (already merged with the conf by Airflow) wins",
        "a declared Param left empty keeps the task's priority",
    ],
)
def test_the_run_conf_overrides_the_priority(
    world: QuotaWorld, conf: dict[str, Any], params: dict[str, Any], priority: int
) -> None:
    job_id = deferred(operator(), context(conf=conf, params=params)).job_id
    assert world.job(job_id).priority == priority


def test_an_override_above_the_share_max_priority_fails_the_task(world: QuotaWorld) -> None:
    with pytest.raises(AirflowFailException) as failure:
        operator().execute(context(conf={"quota_priority": 60}))
    assert str(failure.value) == (
        f"quota job {derived_job_name('train_daily', 'train', RUN_ID, -1)!r} was not submitted"
        " (quota_priority=60 from the run's conf): priority: 60 is above share 'research''s max_priority 50"
    )
    assert world.store.jobs() == []


def test_an_override_that_is_not_an_integer_fails_the_task(world: QuotaWorld) -> None:
    with pytest.raises(
        AirflowFailException, match="quota_priority in the run's conf must be an integer 0-9999, got '9000'"
    ):
        operator().execute(context(conf={"quota_priority": "9000"}))


# -- documentation ---------------------------------------------------------------------------


def documented_parameters(cls: type[BaseOperator]) -> dict[str, str]:
    """``:param name: text`` blocks of a class docstring, continuation lines joined."""
    doc = cls.__doc__ or ""
    blocks = re.findall(r":param (\w+):(.*?)(?=\n\s*:param |\Z)", doc, flags=re.S)
    return {name: " ".join(text.split()) for name, text in blocks}


@pytest.mark.parametrize("cls", [QuotaTrainingOperator, QuotaJobSensor, QuotaCapacitySensor], ids=lambda c: c.__name__)
def test_templated_markers_match_template_fields(cls: type[BaseOperator]) -> None:
    documented = documented_parameters(cls)
    marked = {name for name, text in documented.items() if "(templated)" in text}
    assert marked == set(cls.template_fields)
    assert set(cls.template_fields) <= set(documented)


def test_every_argument_is_documented() -> None:
    import inspect

    arguments = set(inspect.signature(QuotaTrainingOperator.__init__).parameters) - {"self", "kwargs"}
    assert arguments == set(documented_parameters(QuotaTrainingOperator))


def test_the_story_is_the_jobs_own_when_a_name_is_reused(world: QuotaWorld) -> None:
    first = world.submit("nightly", {"duration": 10})
    world.step(1000.0)
    world.step(1100.0)
    second = world.submit("nightly", {"duration": 10})  # the next run, same job_name
    world.step(1200.0)
    world.step(1300.0)
    hook = QuotaHook()
    assert hook.job_story(second.id) == [
        "t=1200 SUBMITTED nightly [research]",
        "t=1200 PLACED nightly [research] on 1x ml.g5.xlarge, attempt 1: within its share's limit",
        "t=1300 SUCCEEDED nightly [research]",
    ]
    assert hook.job_story(first.id)[-1] == "t=1100 SUCCEEDED nightly [research]"


@pytest.mark.parametrize("timeout", [None, timedelta(hours=6)], ids=["no execution_timeout", "6 h"])
def test_execution_timeout_bounds_the_deferred_wait(world: QuotaWorld, timeout: timedelta | None) -> None:
    """As Airflow's own deferrable operators: the trigger's wait ends with the task's
    execution_timeout (a task waiting for quota fails then instead of waiting forever)."""
    with pytest.raises(TaskDeferred) as deferral:
        operator(execution_timeout=timeout).execute(context())
    assert deferral.value.timeout == timeout


# -- TaskFlow and templates (issue 16) -----------------------------------------------------


def test_taskflow_outputs_pass_the_parse_time_check() -> None:
    from airflow.sdk import DAG, task

    @task
    def decide() -> dict[str, Any]:
        return {}

    with DAG("taskflow_check", schedule=None):
        plan = decide()
        op = QuotaTrainingOperator(
            task_id="train",
            share=plan["share"],
            instance_preferences=plan["preferences"],
            priority=plan["priority"],
            command=plan["command"],
        )
    assert op.argument_problems(parse_time=True) == []


def test_rendered_text_reads_as_the_list_or_integer_a_parameter_expects() -> None:
    rendered = {
        "instance_preferences": '[{"instance_type": "ml.g5.xlarge", "count": "2"}]',
        "priority": "7",
        "max_pending_time": "600",
        "expected_runtime": "5400",
        "retry_attempts": "3",
        "preemption_retries": "2",
        "command": '["python", "train.py"]',
    }
    op = operator(**{name: "{{ params." + name + " }}" for name in rendered})
    for name, text in rendered.items():  # what Jinja renders: text
        setattr(op, name, text)
    op._read_rendered()
    assert op.argument_problems() == []
    assert op.instance_preferences == [{"instance_type": "ml.g5.xlarge", "count": 2}]
    assert (op.priority, op.max_pending_time, op.retry_attempts, op.preemption_retries) == (7, 600.0, 3, 2)
    assert op.expected_runtime == 5400.0
    assert op.command == ["python", "train.py"]


def test_a_rendered_value_that_is_not_what_the_parameter_expects_is_named() -> None:
    op = operator(priority="{{ params.p }}", instance_preferences="{{ params.prefs }}")
    op.priority, op.instance_preferences = "seven", "[not json"  # as Jinja rendered them
    op._read_rendered()
    problems = [str(p) for p in op.argument_problems()]
    assert any(p.startswith("priority:") for p in problems), problems
    assert any(p.startswith("instance_preferences:") for p in problems), problems


# -- what an amazon-provider user expects (issue 38) ----------------------------------------


def test_without_waiting_the_task_returns_the_submitted_job_and_the_sensor_takes_it(world: QuotaWorld) -> None:
    """``wait_for_completion=False``: submitted, returned at once (no deferral), and
    ``QuotaJobSensor(job_id=train.output)`` reads the id from that return value."""
    ti = TaskInstance()
    summary = operator(wait_for_completion=False).execute(context(ti))
    assert summary is not None and summary["state"] == "SUBMITTED"
    assert ti.xcoms == {"quota_job_id": summary["job_id"]}
    sensor = QuotaJobSensor(task_id="wait", job_id=summary, poke_interval=0.01)
    assert sensor.poke(context()) is False
    world.step(1000.0)
    world.step(1001.0)
    assert sensor.poke(context()) is True
    for returned in ({"Training": {}, "quota": summary}, str(summary["job_id"])):  # sagemaker's shape, Jinja's
        assert QuotaJobSensor(task_id="wait", job_id=returned)._job_id() == summary["job_id"]


def test_poll_interval_is_the_deprecated_name_of_check_interval(world: QuotaWorld) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match="poll_interval is deprecated, use check_interval"):
        op = QuotaTrainingOperator(
            task_id="train", share="research", instance_preferences=G5, command="true", poll_interval=0.2
        )
    assert op.check_interval == op.poll_interval == 0.2
    op.poll_interval = 0.05  # code that set the old attribute
    assert deferred(op, context()).poll_interval == 0.05


def test_max_attempts_gives_up_waiting_in_the_worker_and_leaves_the_job(
    world: QuotaWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    op = operator(deferrable=False, max_attempts=3, check_interval=0.01)
    with pytest.raises(AirflowException, match=r"was still SUBMITTED after 3 looks 0.01 s apart \(max_attempts\)"):
        op.execute(context())
    assert op.job_id is not None
    assert world.job(op.job_id).state == "SUBMITTED"  # not cancelled: a retry waits on it again
    assert (
        f"gave up waiting for quota job {op.job_id} after 3 looks 0.01 s apart (max_attempts): it is SUBMITTED"
        " and is left as it is; a retry of this task waits on it again" in capsys.readouterr().out
    )
    assert deferred(operator(), context(TaskInstance(try_number=2))).job_id == op.job_id


def test_max_attempts_gives_up_in_the_trigger_at_an_absolute_time(world: QuotaWorld) -> None:
    before = time.time()
    trigger = deferred(operator(max_attempts=20, check_interval=0.01), context())
    assert trigger.give_up_at is not None and before + 0.2 <= trigger.give_up_at <= time.time() + 0.2
    restarted = QuotaJobTrigger(**trigger.serialize()[1])  # another triggerer keeps the same time
    events = asyncio.run(events_of(restarted.run(), timeout=30))
    payload = payload_of(events[0])
    assert (payload["status"], payload["state"]) == ("timeout", "SUBMITTED")
    assert time.time() >= trigger.give_up_at
    with pytest.raises(AirflowException, match="was still SUBMITTED after 20 looks"):
        operator(max_attempts=20).execute_complete(context(), payload)


@pytest.mark.parametrize(
    ("setting", "given", "expected"),
    [(None, None, True), ("False", None, False), ("true", None, True), ("False", True, True)],
    ids=["not set: deferred", "set false: not", "set true", "the DAG's own choice wins"],
)
def test_deferrable_follows_default_deferrable_when_the_deployment_sets_it(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, given: bool | None, expected: bool
) -> None:
    if setting is None:
        monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(ENVIRONMENT_VARIABLE, setting)
    chosen = {} if given is None else {"deferrable": given}
    assert operator(**chosen).deferrable is expected
    assert QuotaJobSensor(task_id="wait", job_id=1, **chosen).deferrable is expected
    assert QuotaCapacitySensor(task_id="room", share="prod", instance_preferences=G5, **chosen).deferrable is expected


def test_a_default_deferrable_that_is_not_a_boolean_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "sometimes")
    with pytest.raises(AirflowConfigException, match=r'"default_deferrable" key in "operators" section'):
        operator()


def test_a_generated_airflow_cfg_does_not_turn_deferral_off(tmp_path: Path) -> None:
    """Airflow writes ``default_deferrable = false`` into every airflow.cfg it generates: such a
    file is no choice of the deployment's, and the trainings still wait deferred. In a fresh
    process with its own AIRFLOW_HOME (the generation changes Airflow's configuration)."""
    program = (
        "from airflow.configuration import conf, write_default_airflow_configuration_if_needed\n"
        "write_default_airflow_configuration_if_needed()\n"
        "conf.read(conf.get_mandatory_value('core', 'dags_folder').rsplit('/', 1)[0] + '/airflow.cfg')\n"
        "from airflow_quota.operators.deferral import default_deferrable\n"
        "print(conf.getboolean('operators', 'default_deferrable'), default_deferrable())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")} | {"AIRFLOW_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "\ndefault_deferrable = false\n" in (tmp_path / "airflow.cfg").read_text()
    assert done.stdout.split()[-2:] == ["False", "True"]  # Airflow reads false; the trainings defer


@pytest.mark.parametrize(
    ("scenario", "line"),
    [
        (pending_timeout, "failed outside its training: it waited longer than its max_pending_time to be placed"),
        (capacity_error, "failed outside its training: the provider had no capacity for its instance preferences"),
        (preemption_limit, "failed outside its training: it was preempted more times than its preemption_retries"),
        (cancelled, "failed outside its training: it was cancelled (CANCELLED: cancelled)"),
        (
            lambda world: _exhausted(world, "RunnerLost"),
            "failed outside its training: its last attempt (1) ended on the platform, not in the training: RunnerLost",
        ),
        (attempts_exhausted, None),
    ],
    ids=["pending timeout", "capacity error", "preemption limit", "cancelled", "the runner lost", "the code failed"],
)
def test_a_failure_outside_the_training_is_said_in_one_line_before_the_exception(
    world: QuotaWorld,
    capsys: pytest.CaptureFixture[str],
    scenario: Callable[[QuotaWorld], JobRow],
    line: str | None,
) -> None:
    job = world.job(scenario(world).id)
    capsys.readouterr()
    with pytest.raises(AirflowException):
        operator().execute_complete(context(), event_for(job))
    said = [entry for entry in capsys.readouterr().out.splitlines() if "outside its training" in entry]
    if line is None:  # the training's own exit code: its output tells why, nothing more to say
        assert said == []
    else:
        assert len(said) == 1 and f"quota job {job.id} ({job.name}) {line}" in said[0], said


def _exhausted(world: QuotaWorld, reason: str) -> JobRow:
    job = world.submit("lost", {"duration": 100, "failures": [{"after": 5, "reason": reason}]})
    world.step(1000.0)
    world.step(1100.0)
    return job


def test_a_refused_job_is_said_in_one_line_before_the_exception(capsys: pytest.CaptureFixture[str]) -> None:
    event = {"status": "error", "job_id": 9, "state": None, "reason": None}
    with pytest.raises(AirflowException, match="quota job 9: the quota scheduler refused"):
        operator().execute_complete(context(), {**event, "message": "the quota scheduler refused quota job 9: no"})
    assert "quota job 9 failed outside its training, which never ran: the quota scheduler refused" in (
        capsys.readouterr().out
    )


def test_the_trainings_last_lines_come_before_the_quotas_closing_lines(
    world: QuotaWorld, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job that ran and ended between two looks: its log is read before the line saying it
    SUCCEEDED, and the operator's summary comes last."""
    log = tmp_path / "training.log"
    log.write_text("epoch 1\nsaved the model\n")
    job = world.store.submit(request("quick"), "local", {"duration": 100})
    world.step(1000.0)
    with world.engine.begin() as connection:
        connection.execute(update(Attempt).where(Attempt.job_id == job.id).values(external_name=str(log)))
    world.step(1100.0)
    assert world.job(job.id).state == "SUCCEEDED"
    capsys.readouterr()
    trigger = QuotaJobTrigger(job_id=job.id, poll_interval=0.01, print_log=True)
    events = asyncio.run(events_of(trigger.run(), timeout=30))
    operator().execute_complete(context(), payload_of(events[0]))
    out = capsys.readouterr().out
    order = [
        out.index("[training, attempt 1] epoch 1"),
        out.index("[training, attempt 1] saved the model"),
        out.index("SUCCEEDED after 1 attempt(s)"),
        out.index(f"quota job {job.id} SUCCEEDED on 1x ml.g5.xlarge"),
    ]
    assert order == sorted(order), out
