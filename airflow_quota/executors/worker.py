"""The worker processes of ``QuotaExecutor``: LocalExecutor's, with the placement in the task's
environment.

LocalExecutor forks its workers once, at start; a task's process is forked later by the Task
SDK's supervisor inside a worker. So the placement (``executors/placement.py``) travels with the
workload through the queue, and the worker sets it in its own environment just for that task
(the supervisor's fork inherits it), then restores it. A try whose supervisor fails (Airflow's
execution API cannot be reached) gets one line saying why in its own log
(``executors/task_log.py``), and the executor gets that line as the event's info.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.sharedctypes
import os
import signal
from multiprocessing import Queue, SimpleQueue
from typing import Any

import structlog
from airflow.executors.base_executor import BaseExecutor, get_execution_api_server_url
from airflow.executors.workloads import ExecuteTask

from airflow_quota.executors.placement import VARIABLES
from airflow_quota.executors.task_log import append_to_task_log, failure_cause

WorkItem = tuple[Any, dict[str, str]]
"""A workload (task, callback or connection test) and the environment it runs with."""


def run_worker(
    logger_name: str,
    input: SimpleQueue[WorkItem | None],
    output: Queue[Any],
    unread_messages: multiprocessing.sharedctypes.Synchronized[int],
    team_conf: Any,
) -> None:
    """LocalExecutor's ``_run_worker`` loop, for work items that carry an environment."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the scheduler, not the tasks
    log = structlog.get_logger(logger_name)
    log.info("QuotaExecutor worker starting up pid=%d", os.getpid())
    prefix = "airflow worker -- QuotaExecutor:"
    while True:
        try:
            item = input.get()
        except EOFError:
            log.info("the task queue was closed: worker %s ends", multiprocessing.current_process().name)
            break
        if item is None:
            return
        workload, env = item
        with unread_messages:
            unread_messages.value -= 1
        if workload.running_state is not None:
            output.put((workload.key, workload.running_state, None))
        saved = {name: os.environ.get(name) for name in VARIABLES}
        os.environ.update(env)
        server = None
        try:
            server = get_execution_api_server_url(team_conf)
            BaseExecutor.run_workload(
                workload,
                server=server,
                proctitle=f"{prefix} {workload.display_name}",
                subprocess_logs_to_stdout=True,
            )
            output.put((workload.key, workload.success_state, None))
        except Exception as exc:
            # the try never ran, or its supervisor broke: one line says why, here, in the try's
            # own log (nothing else writes there now) and, as the event's info, to the executor
            # (QuotaExecutor reports it to the quota scheduler: the job's failure detail)
            cause = failure_cause(exc, server)
            log.exception("Workload execution failed: %s", cause, workload_type=type(workload).__name__)
            if isinstance(workload, ExecuteTask):
                append_to_task_log(workload.log_path, cause)
            output.put((workload.key, workload.failure_state, cause))
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
