"""QuotaExecutor's Celery delegate in pieces, without a broker: the ``[quota] executor_delegate``
setting, the placement the workers take from a message's header, a preemption's SIGTERM (the
executor's broadcast, the worker's command that signals the try's task process), and the ends the
delegate reads from the result backend (a fake fetcher). ``test_executor_celery_end_to_end.py`` runs it whole."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from airflow.exceptions import AirflowConfigException
from airflow.executors.base_executor import ExecutorConf
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.sdk.exceptions import AirflowTaskTimeout
from airflow.utils.state import TaskInstanceState
from celery.worker.control import Panel

from airflow_quota.executors import celery_worker
from airflow_quota.executors.celery_delegate import CELERY_TASK, CeleryDelegate, CeleryEnd
from airflow_quota.executors.celery_worker import PLACEMENT_HEADER, SIGNAL_COMMAND, placement_of
from airflow_quota.executors.jobs import TaskIdentity
from airflow_quota.executors.placement import INSTANCE_TYPE, JOB_ID, SHARE, TRAINING_PLAN, Placement
from airflow_quota.executors.quota_executor import QuotaExecutor, Released, executor_delegate
from airflow_quota.get_provider_info import get_provider_info
from tests.waiting import wait_for

PLACEMENT = Placement("research", 7, 2, "ml.g5.xlarge", 1, None, "/ckpt/enc", 1)


@pytest.mark.parametrize(
    ("setting", "delegate"),
    [(None, "local"), ("local", "local"), ("celery", "celery"), (" Celery ", "celery")],
    ids=["unset: the local worker processes", "local", "celery", "case and spaces do not matter"],
)
def test_the_delegate_is_read_from_the_quota_section(
    setting: str | None, delegate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if setting is None:
        monkeypatch.delenv("AIRFLOW__QUOTA__EXECUTOR_DELEGATE", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__QUOTA__EXECUTOR_DELEGATE", setting)
    assert executor_delegate(ExecutorConf(team_name=None)) == delegate


def test_an_unknown_delegate_names_the_setting_and_the_values_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__QUOTA__EXECUTOR_DELEGATE", "kubernetes")
    with pytest.raises(AirflowConfigException) as refused:
        executor_delegate(ExecutorConf(team_name=None))
    assert str(refused.value).startswith("[quota] executor_delegate = 'kubernetes': choose one of local, celery")


@pytest.mark.parametrize(
    ("delegate", "pre_assigned"),
    [("local", False), ("celery", True)],
    ids=["local: no Celery, no id", "celery: each queued try gets the Celery task id it is sent with"],
)
def test_the_executor_owns_a_celery_delegate_only_when_told(
    delegate: str, pre_assigned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__QUOTA__EXECUTOR_DELEGATE", delegate)
    executor = QuotaExecutor()
    assert (executor.celery is not None, executor.pre_assigns_external_executor_id) == (pre_assigned, pre_assigned)


class FakeCelery:
    """The delegate's broadcast, recorded."""

    def __init__(self) -> None:
        self.signalled: list[str] = []

    def signal(self, ti_id: str) -> None:
        self.signalled.append(ti_id)


@pytest.mark.parametrize(
    ("state", "deadline", "signal_until"),
    [("running", 1_030.0, 1_005.0), ("queued", 1_000.0, None)],
    ids=[
        "running on a worker: SIGTERM broadcast for 5 s, cleared after the share's 30 s grace",
        "still in the broker: nothing to signal, cleared once it runs",
    ],
)
def test_a_task_on_a_celery_worker_is_signalled_through_the_workers_and_cleared_after_the_grace(
    state: str, deadline: float, signal_until: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__QUOTA__EXECUTOR_DELEGATE", "celery")
    executor = QuotaExecutor()
    executor._try_state = lambda released: state  # type: ignore[method-assign]  # Airflow's database
    released = Released(None, "ti-id", TaskIdentity("dag", "train", "run", -1, 1), 7, 2, PLACEMENT.environment())

    executor._stop(released, grace=30.0, now=1_000.0)
    executor._stop(released, grace=30.0, now=1_001.0)  # asked again at the next follow: nothing changes

    assert (released.stop_at, released.stop_deadline, released.signal_until, released.cleared) == (
        1_000.0,
        deadline,
        signal_until,
        False,
    )


def test_the_sigterm_broadcast_names_the_try_and_a_broker_error_is_retried_at_the_next_follow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__QUOTA__EXECUTOR_DELEGATE", "celery")
    executor = QuotaExecutor()
    broadcasts: list[tuple[str, dict[str, Any]]] = []
    assert executor.celery is not None

    def broadcast(command: str, arguments: dict[str, Any]) -> None:
        broadcasts.append((command, arguments))
        if len(broadcasts) == 1:
            raise ConnectionError("the broker is down")

    executor.celery.app.control.broadcast = broadcast  # type: ignore[method-assign]
    released = Released(None, "ti-id", TaskIdentity("dag", "train", "run", -1, 1), 7, 2, PLACEMENT.environment())

    executor._signal_celery(released)  # logged, not raised: the scheduler's loop goes on
    executor._signal_celery(released)

    assert broadcasts == [(SIGNAL_COMMAND, {"ti_id": "ti-id", "signal_name": "SIGTERM"})] * 2


def test_the_provider_declares_the_setting_with_its_default() -> None:
    option = get_provider_info()["config"]["quota"]["options"]["executor_delegate"]
    assert (option["default"], option["example"], option["type"]) == ("local", "celery", "string")


def sleeper(title: str) -> subprocess.Popen[bytes]:
    """A child process titled as the Task SDK titles a task's process, until signalled; it forks
    a child of its own, which inherits the title (as a task's data loader workers do)."""
    code = f"import os, setproctitle, time; setproctitle.setproctitle({title!r}); os.fork(); time.sleep(120)"
    return subprocess.Popen([sys.executable, "-c", code])


def titled(process: subprocess.Popen[bytes], title: str) -> bool:
    """The sleeper and its forked child both carry ``title``."""
    try:
        sleeper = psutil.Process(process.pid)
        family = [sleeper, *sleeper.children()]
        return len(family) == 2 and all(" ".join(p.cmdline()).strip() == title for p in family)
    except psutil.Error:
        return False


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a killed process not yet reaped still "runs" for psutil)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_worker_signals_only_the_task_process_of_the_try_it_is_asked_for_and_only_once() -> None:
    """The command finds the try's process by its title among the worker's descendants (not the
    processes it forked, which inherit the title); another try's process (another task instance
    id) and an unknown id are left alone."""
    target_id, other_id = "0190f1aa-0000-7000-8000-000000000001", "0190f1aa-0000-7000-8000-000000000002"
    target, other = sleeper(f"airflow worker -- {target_id}"), sleeper(f"airflow worker -- {other_id}")
    forks: list[psutil.Process] = []
    try:
        wait_for(
            lambda: titled(target, f"airflow worker -- {target_id}") and titled(other, f"airflow worker -- {other_id}"),
            20,
            "the sleepers to take their titles",
        )
        forks = [*psutil.Process(target.pid).children(), *psutil.Process(other.pid).children()]

        unknown = celery_worker.signal_task(None, ti_id="0190f1aa-0000-7000-8000-00000000dead")
        first = celery_worker.signal_task(None, ti_id=target_id, signal_name="SIGTERM")
        target.wait(timeout=20)
        again = celery_worker.signal_task(None, ti_id=target_id)
        refused = celery_worker.signal_task(None, ti_id=other_id, signal_name="SIGKILL")

        assert unknown == {"ok": "task instance 0190f1aa-0000-7000-8000-00000000dead does not run here"}
        assert first == {"ok": f"SIGTERM to [{target.pid}]"}
        assert target.returncode == -signal.SIGTERM
        assert again == {"ok": f"task instance {target_id} already signalled"}
        assert "error" in refused and other.poll() is None  # only SIGTERM may be asked for
        assert all(alive(fork) for fork in forks), forks  # the task's own handler decides for them
    finally:
        for process in (target, other):
            process.kill()
            process.wait()
        for fork in forks:
            with contextlib.suppress(psutil.NoSuchProcess):
                fork.kill()
        celery_worker._signalled.clear()


def test_the_worker_registers_its_command_with_celery() -> None:
    """Celery's consumer dispatches a broadcast by name from this registry."""
    assert Panel.data[SIGNAL_COMMAND] is celery_worker.signal_task


def request_with(headers: Mapping[str, Any] | None) -> SimpleNamespace:
    """A Celery task's request as the worker sees it: custom headers in ``headers``."""
    return SimpleNamespace(headers=headers)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({PLACEMENT_HEADER: PLACEMENT.environment()}, PLACEMENT.environment()),
        (
            {PLACEMENT_HEADER: {**PLACEMENT.environment(), "PATH": "/evil", "LD_PRELOAD": "x.so"}},
            PLACEMENT.environment(),
        ),
        (None, {}),
        ({"other": "header"}, {}),
        ({PLACEMENT_HEADER: "not a mapping"}, {}),
    ],
    ids=[
        "the placement QuotaExecutor sent",
        "only AIRFLOW_QUOTA_* names: a message sets nothing else on the worker",
        "a message without custom headers (CeleryExecutor's own tasks)",
        "other headers only",
        "a malformed header",
    ],
)
def test_the_worker_takes_only_the_placement_from_a_message(
    headers: Mapping[str, Any] | None, expected: dict[str, str]
) -> None:
    assert placement_of(request_with(headers)) == expected


def test_the_worker_sets_the_placement_for_the_task_and_restores_its_own_environment_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SHARE, "the worker's own")
    monkeypatch.setenv(TRAINING_PLAN, "left over")  # this placement has no training plan
    monkeypatch.delenv(JOB_ID, raising=False)
    task = SimpleNamespace(request=request_with({PLACEMENT_HEADER: PLACEMENT.environment()}))

    celery_worker.set_placement(task_id="celery-1", task=task)
    during = Placement.current()
    leaked_plan = os.environ.get(TRAINING_PLAN)
    celery_worker.restore_environment(task_id="celery-1", task=task)

    assert during == PLACEMENT
    assert leaked_plan is None
    assert (os.environ.get(SHARE), os.environ.get(TRAINING_PLAN), os.environ.get(JOB_ID)) == (
        "the worker's own",
        "left over",
        None,
    )
    assert celery_worker._saved == {}


def test_a_task_quota_executor_did_not_send_runs_in_the_workers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INSTANCE_TYPE, "the worker's own")
    task = SimpleNamespace(request=request_with(None))
    celery_worker.set_placement(task_id="celery-2", task=task)
    assert os.environ[INSTANCE_TYPE] == "the worker's own"
    celery_worker.restore_environment(task_id="celery-2", task=task)
    assert os.environ[INSTANCE_TYPE] == "the worker's own"


class FakeFetcher:
    """The provider's ``BulkStateFetcher``, answering from a table of Celery states."""

    def __init__(self, states: Mapping[str, tuple[str, Any]]) -> None:
        self.states = states
        self.asked: list[set[str]] = []

    def get_many(self, results: Sequence[Any]) -> Mapping[str, tuple[str, Any]]:
        self.asked.append({r.task_id for r in results})
        return {r.task_id: self.states[r.task_id] for r in results if r.task_id in self.states}


def key(task_id: str) -> TaskInstanceKey:
    return TaskInstanceKey("dag", task_id, "run", 1, -1)


def test_the_delegate_reports_each_ended_task_once_and_keeps_following_the_others() -> None:
    delegate = CeleryDelegate(ExecutorConf(team_name=None))
    failure = RuntimeError("the task's process exited 1")
    delegate.fetcher = FakeFetcher(  # type: ignore[assignment]
        {
            "c-ok": ("SUCCESS", None),
            "c-bad": ("FAILURE", failure),
            "c-gone": ("REVOKED", None),
            "c-run": ("STARTED", None),
        }
    )
    for name in ("ok", "bad", "gone", "run", "queued"):  # "queued": no result yet, PENDING
        delegate.sent[key(name)] = SimpleNamespace(task_id=f"c-{name}")  # type: ignore[assignment]

    first, second = delegate.ended(), delegate.ended()

    assert first == [
        CeleryEnd(key("ok"), TaskInstanceState.SUCCESS, None),
        CeleryEnd(key("bad"), TaskInstanceState.FAILED, failure),
        CeleryEnd(key("gone"), TaskInstanceState.FAILED, None),
    ]
    assert second == []
    assert set(delegate.sent) == {key("run"), key("queued")}
    assert delegate.fetcher.asked[-1] == {"c-run", "c-queued"}  # type: ignore[attr-defined]


def test_a_send_past_the_operation_timeout_is_an_error_the_scheduler_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AirflowTaskTimeout`` is a ``BaseException``: raised out of ``send`` it killed Airflow's
    scheduler; the delegate raises a ``TimeoutError``, which the executor logs and retries."""
    monkeypatch.setenv("AIRFLOW__QUOTA__EXECUTOR_DELEGATE", "celery")
    executor = QuotaExecutor()
    assert executor.celery is not None
    task = executor.celery.app.tasks[CELERY_TASK]

    def apply_async(**_: Any) -> None:
        raise AirflowTaskTimeout("Timeout, PID: 1")

    monkeypatch.setattr(task, "apply_async", apply_async)
    key = TaskInstanceKey("dag", "train", "run", 1, -1)
    workload = SimpleNamespace(model_dump_json=lambda: "{}", ti=SimpleNamespace(external_executor_id="celery-id"))
    with pytest.raises(TimeoutError, match=r"sending a task took longer than \[celery\] operation_timeout"):
        executor.celery.send(key, workload, "ml.g5.xlarge", PLACEMENT.environment())  # type: ignore[arg-type]
