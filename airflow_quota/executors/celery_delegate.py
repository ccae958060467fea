"""``[quota] executor_delegate = celery``: ``QuotaExecutor`` runs released tasks on Celery workers.

``QuotaExecutor`` keeps its own hold, release, preempt and adopt logic; only where a released task
runs changes. Instead of LocalExecutor's worker processes, the workload goes to the Celery queue
named after the instance type the quota scheduler placed it on, so each GPU host runs
``airflow celery worker -q <instance type>`` and takes only what was placed on its type. The
sending and the state polling are the celery provider's own machinery, what ``CeleryExecutor``
uses: its Celery app (``create_celery_app``, from ``[celery]``), its ``execute_workload`` task (the
worker runs the workload exactly as for ``CeleryExecutor``) and its ``BulkStateFetcher`` (the
result backend). ``QuotaExecutor`` turns the states into its own events, so the ends are reported
to the quota scheduler as on the local path.

The placement (``AIRFLOW_QUOTA_*``, ``executors/placement.py``) cannot be set in the environment
of a process on another host, and ``execute_workload`` takes only the workload, whose schema has
no room for it. So it travels in the Celery message's header ``PLACEMENT_HEADER``, and
``executors/celery_worker.py``, loaded by each worker through Celery's ``imports`` setting
(``WORKER_CELERY_CONFIG``), sets it in the worker process's environment for that task only.

A preemption's SIGTERM cannot be sent from the scheduler's host either: the delegate broadcasts
that module's remote-control command (``signal``), and the worker running the try signals its task
process. Celery's ``revoke(terminate=True, signal="SIGTERM")`` is not used: it marks the task
REVOKED in the result backend and acknowledges its message at once, while the try still runs its
grace (the executor would report an end that has not happened), it remembers the id as revoked,
so a try sent again under the same id after a scheduler restart would be dropped, and it signals
the pool process (the Task SDK's supervisor, which forwards SIGTERM to the task only once it
waits on it, and dies of it before).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.providers.celery.executors.celery_executor_utils import (
    OPERATION_TIMEOUT,
    BulkStateFetcher,
    create_celery_app,
)
from airflow.providers.common.compat.sdk import timeout
from airflow.sdk.exceptions import AirflowTaskTimeout
from airflow.utils.state import TaskInstanceState
from celery import states as celery_states

from airflow_quota.executors.celery_worker import PLACEMENT_HEADER, SIGNAL_COMMAND

if TYPE_CHECKING:
    from airflow.executors.workloads import ExecuteTask
    from airflow.models.taskinstancekey import TaskInstanceKey
    from celery.result import AsyncResult

WORKER_CELERY_CONFIG = '{"imports": ["airflow_quota.executors.celery_worker"]}'
"""``[celery] extra_celery_config`` for the workers: Celery imports the worker module at start."""
CELERY_TASK = "execute_workload"
"""The celery provider's task that runs a workload on a worker (``celery_executor_utils``)."""


@contextlib.contextmanager
def _within_operation_timeout(what: str) -> Iterator[None]:
    """``[celery] operation_timeout`` around a broker call, its timeout raised as a
    ``TimeoutError``: Airflow's ``AirflowTaskTimeout`` is a ``BaseException``, which the
    scheduler's loop would not survive (the first call on a loaded machine may spend the whole
    timeout loading Celery's result backend)."""
    try:
        with timeout(seconds=OPERATION_TIMEOUT):  # type: ignore[no-untyped-call]
            yield
    except AirflowTaskTimeout as exc:
        raise TimeoutError(f"{what} took longer than [celery] operation_timeout ({OPERATION_TIMEOUT:g} s)") from exc


@dataclass(frozen=True, slots=True)
class CeleryEnd:
    """A Celery-run task that ended, as an executor event."""

    key: TaskInstanceKey
    state: TaskInstanceState
    info: Any


class CeleryDelegate:
    """Sends released workloads to the Celery queue of their instance type and reports their ends.

    :param conf: the executor's configuration (``ExecutorConf``): the ``[celery]`` broker, result
        backend and options, as ``CeleryExecutor`` reads them.
    """

    def __init__(self, conf: Any) -> None:
        self.app = create_celery_app(conf)
        self.fetcher = BulkStateFetcher(1, celery_app=self.app)
        self.sent: dict[TaskInstanceKey, AsyncResult] = {}

    def send(self, key: TaskInstanceKey, workload: ExecuteTask, queue: str, environment: Mapping[str, str]) -> str:
        """Publish the workload on ``queue`` with its placement in the header; the Celery task id.

        The Celery task id is the task instance's ``external_executor_id``, which the scheduler
        assigned when it queued the try (``QuotaExecutor`` asks for it, as ``CeleryExecutor``
        does): a try sent again after a scheduler restart keeps its id, so whichever of its two
        messages a worker takes first runs it, Airflow refuses the other (the task instance is
        no longer QUEUED), and the result followed is the run's. Raises what the broker raises
        (or ``TimeoutError`` after ``[celery] operation_timeout``): the caller keeps the task
        held and tries again."""
        task = self.app.tasks[CELERY_TASK]
        with _within_operation_timeout("sending a task"):
            result = task.apply_async(
                args=(workload.model_dump_json(),),
                queue=queue,
                task_id=workload.ti.external_executor_id,  # None: Celery makes one up
                headers={PLACEMENT_HEADER: dict(environment)},
            )
        self.sent[key] = result
        return str(result.task_id)

    def signal(self, ti_id: str) -> None:
        """Ask the workers to send SIGTERM to the task process of try ``ti_id`` (a preemption):
        a broadcast without waiting for replies (the scheduler's loop must not block); the worker
        running it acts, once, and logs it. Raises what the broker raises (or ``TimeoutError``)."""
        with _within_operation_timeout("broadcasting a SIGTERM"):
            self.app.control.broadcast(SIGNAL_COMMAND, arguments={"ti_id": ti_id, "signal_name": "SIGTERM"})

    def ended(self) -> list[CeleryEnd]:
        """The sent tasks that ended since the last call (one query of the result backend)."""
        if not self.sent:
            return []
        states = self.fetcher.get_many(list(self.sent.values()))
        ends: list[CeleryEnd] = []
        for key, result in list(self.sent.items()):
            state, info = states.get(result.task_id, (None, None))
            if state == celery_states.SUCCESS:
                ends.append(CeleryEnd(key, TaskInstanceState.SUCCESS, info))
            elif state in (celery_states.FAILURE, celery_states.REVOKED):
                ends.append(CeleryEnd(key, TaskInstanceState.FAILED, info))
            else:  # PENDING, STARTED, RETRY: still queued or running
                continue
            del self.sent[key]
        return ends
